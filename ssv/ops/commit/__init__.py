"""KV commit of a device round: compaction of the accepted path and the compressed blocks it completes."""

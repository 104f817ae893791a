"""Attention of one draft-tree level: the drafter's ring window plus each node's own ancestor rows."""

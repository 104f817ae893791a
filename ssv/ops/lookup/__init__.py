"""The context lookup and the chain's attachment to the draft tree in two Triton launches."""

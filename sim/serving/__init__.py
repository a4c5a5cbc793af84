"""Serving layer of one replica: request state, the paged KV cache and iteration-level schedulers."""

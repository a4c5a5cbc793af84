"""Request streams: the request types, synthetic generation and trace files."""

"""The measured data the project validates and calibrates against, shipped inside the package.

`measured_data_root()` is a directory in the layout of the upstream snapshot (`../shared/data`:
`aiconfigurator/<system>/*.csv.gz`, `e2e/*.csv`, `vidur/*.csv.gz`), with every table stored as
xz-compressed CSV (`<table>.csv.xz`) whose text is byte-identical to the upstream table. Readers
name tables by their upstream file name and go through `resolve` / `open_text` / `read_text_bytes`,
so the same code reads the shipped copy and any upstream-layout directory passed with `--data`.
`python -m sim.measured.vendor` regenerates the copy; sim/data/measured/README.md says what it holds.
"""

from sim.measured.files import (
    MANIFEST_FILE,
    VENDORED_SUFFIX,
    content_sha256,
    measured_data_root,
    open_text,
    read_text_bytes,
    resolve,
    table_name,
)

__all__ = ["MANIFEST_FILE", "VENDORED_SUFFIX", "content_sha256", "measured_data_root", "open_text",
           "read_text_bytes", "resolve", "table_name"]

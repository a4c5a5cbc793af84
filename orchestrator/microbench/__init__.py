"""GPU microbenchmark collector for the target-measured tier (`kernelsight microbench run|compare`).

Reads a `kernelsight microbench plan` CSV, measures each point with PyTorch on a CUDA device and
writes tables in the layout of shared/data/aiconfigurator/<system>/ plus `device.json`, so that
`kernelsight calibrate --microbench DIR` reads them unchanged. Importing this package never
imports torch: every module that needs it imports it inside functions.
"""

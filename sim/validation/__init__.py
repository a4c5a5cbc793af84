"""End-to-end validation: measured rows -> scenarios -> simulated predictions -> scores (docs/validation.md)."""

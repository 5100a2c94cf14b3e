"""Hidden checks, one module per lab: instructor side only, never inside a sandbox."""

"""slotserver.model.model: see docs/architecture.md. Empty on purpose: importing a
submodule must not import its siblings (the scheduler stays free of torch)."""

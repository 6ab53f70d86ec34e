"""What every epiflow package shares: the error contract (`core.errors`)."""

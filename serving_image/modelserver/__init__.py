"""modelserver."""

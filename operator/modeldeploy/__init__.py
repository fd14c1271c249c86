"""modeldeploy."""

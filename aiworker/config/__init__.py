"""Configuration: a TOML file read into strict pydantic models."""

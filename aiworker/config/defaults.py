"""Defaults that code outside the configuration's models reads without importing them
(pydantic): the timer's wake-up decides from these whether a check is due."""

CHECK_INTERVAL = 180  # seconds between checks (`check_interval`)
MIN_CHECK_INTERVAL = 10

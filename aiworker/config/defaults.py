"""Defaults that code outside the configuration's models reads without importing them
(pydantic): the timer's wake-up decides from these whether a check is due."""

CHECK_INTERVAL = 180  # seconds between checks (`check_interval`)
MIN_CHECK_INTERVAL = 10

# Far more than any configuration: a larger file (or a device such as /dev/zero) is
# refused after reading this much, not read until memory runs out.
CONFIG_MAX_BYTES = 1 << 20

"""The one error type of a config file, key or value that cannot be used (exit code 2 in the entry points)."""


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message says where and what is expected."""

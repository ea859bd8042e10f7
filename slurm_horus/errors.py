"""Errors that the CLI turns into one clear line and a non-zero exit."""


class HorusError(Exception):
    """A user-facing error: bad input, bad configuration, missing prerequisite.

    The CLI prints ``horus: <message>`` on stderr and exits with ``exit_code``.
    """

    exit_code = 2

    def __init__(self, message, exit_code=None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(HorusError):
    """Malformed input file or value; the message names file:line or the key."""


class ConfigError(HorusError):
    """Bad site configuration; the message names the key."""

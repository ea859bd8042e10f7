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


def check_output_path(path, option):
    """Refuse an output file that cannot be written (before a long run, not after it): its directory
    must exist and be writable, and the path must not be a directory."""
    import os

    if path is None or path == "-":
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a directory")
    if not os.path.isdir(directory):
        raise InputError(f"{option} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise InputError(f"{option} {path}: not writable")

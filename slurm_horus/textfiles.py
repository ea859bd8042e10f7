"""Users' text files (traces, CSV tables, cluster specs): UTF-8 text, or one clear error naming file:line.

No imports from the rooms; the simulator's trace readers and the interference tables read through it.
"""

import csv

from .errors import InputError


def text_lines(path):
    """The lines of ``path`` as str (line ends kept, as :mod:`csv` wants them); a byte-order mark is
    dropped. Raises InputError for a file that cannot be read or is not UTF-8 (naming the line)."""
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None

    def lines():
        with handle:
            for number, raw in enumerate(handle, 1):
                try:
                    yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError:
                    raise InputError(f"{path}:{number}: not UTF-8 text") from None
    return lines()


def read_text(path):
    """The whole of ``path`` as str (see :func:`text_lines`)."""
    return "".join(text_lines(path))


def csv_records(path, lines=None):
    """A :class:`csv.DictReader` over ``path`` whose iteration turns the csv module's own complaints
    (a NUL byte, a field over its size limit) into InputError naming the line. Returns
    (reader, iterator of (line number, row))."""
    reader = csv.DictReader(lines if lines is not None else text_lines(path))

    def rows():
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise InputError(f"{path}:{reader.line_num}: {exc}") from None
            yield reader.line_num, row
    return reader, rows()


def header_of(reader, path):
    """The field names of a :func:`csv_records` reader (reading line 1), or None for an empty file."""
    try:
        return reader.fieldnames
    except csv.Error as exc:
        raise InputError(f"{path}:1: {exc}") from None

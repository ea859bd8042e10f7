"""Read a batch script's directives exactly where and how sbatch 22.05 reads them.

Rules (checked against the real sbatch 22.05.8 on the local cluster):

* lines are split on ``\\n``; a line starting with ``#SBATCH`` (or the old ``#SLURM``) is a
  directive; any other line whose first non-blank character is ``#``, or a blank line, is skipped;
  the first other line is a command and ends the directive block (later ``#SBATCH`` lines are
  ignored, as are indented ``  #SBATCH`` and ``# SBATCH`` lines);
* a directive line holds any number of options, split as :func:`options.directive_words` does;
* a line whose first word is ``hetjob`` or ``packjob`` (any case) starts the next het component and
  the rest of that line is ignored; the same word later on a line ends that line;
* the options of one component form one argv for getopt, so an option may take its argument from
  the next directive line; a word that is not an option makes sbatch fail ("Invalid directive").

``#HORUS`` lines in the same block carry horus-sbatch's own options (``--class NAME``,
``--model``, ``--batch-size``, ``--off``).
"""

from .options import DirectiveError, directive_words, split_options

SEPARATORS = ("hetjob", "packjob")
SHELLS = {"sh", "bash", "zsh", "ksh", "dash", "mksh", "ash", "yash", "posh"}
_BLANK = " \t\n\v\f\r"


class ScriptDirectives:
    """What sbatch would read from one script."""

    def __init__(self):
        self.components = [[]]      # per het component: [Option]
        self.horus = []             # [(value words, lineno)] from #HORUS lines
        self.block_end = 0          # byte offset of the first command line (or len(script))
        self.error = None           # why sbatch would reject the directives, if it would
        self.shebang = b""          # the first line including its line ending, if it is #!...
        self.newline = b"\n"        # the script's line ending (b"\r\n" when its first line has one)
        self.interpreter = ""       # basename of the shebang's program (env's argument for env)

    @property
    def is_het(self):
        return len(self.components) > 1

    @property
    def is_shell(self):
        return self.interpreter in SHELLS


def _interpreter(shebang_line):
    words = shebang_line[2:].split()
    if not words:
        return ""
    program = words[0].rsplit("/", 1)[-1]
    if program == "env":
        rest = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        program = rest[0].rsplit("/", 1)[-1] if rest else ""
    return program


def read_directives(script, extra_long=None):
    """Parse ``script`` (bytes) into :class:`ScriptDirectives`."""
    found = ScriptDirectives()
    text = script.decode("latin-1")     # one char per byte: offsets stay byte offsets
    first_end = text.find("\n")
    first_line = text if first_end < 0 else text[:first_end + 1]
    if first_line.startswith("#!"):
        found.shebang = script[:len(first_line)]
        found.interpreter = _interpreter(first_line.rstrip("\r\n"))
    if first_line.endswith("\r\n"):
        found.newline = b"\r\n"
    words = [[]]
    offset = 0
    lineno = 0
    found.block_end = len(script)
    while offset < len(text):
        end = text.find("\n", offset)
        next_offset = len(text) if end < 0 else end + 1
        line = text[offset:next_offset if end < 0 else end]
        lineno += 1
        if line.startswith("#SBATCH"):
            rest = line[len("#SBATCH"):]
        elif line.startswith("#SLURM"):
            rest = line[len("#SLURM"):]
        elif line.startswith("#HORUS"):
            try:
                found.horus.append(([value for value, _ in directive_words(line[len("#HORUS"):])], lineno))
            except DirectiveError:
                pass
            offset = next_offset
            continue
        else:
            stripped = line.lstrip(_BLANK)
            if stripped and not stripped.startswith("#"):
                found.block_end = offset
                break
            offset = next_offset
            continue
        try:
            line_words = directive_words(rest)
        except DirectiveError as exc:
            found.error = f"line {lineno}: {exc}"
            line_words = []
        for position, (value, raw) in enumerate(line_words):
            if raw.lower() in SEPARATORS:
                if position == 0:
                    words.append([])
                break
            words[-1].append(value)
        offset = next_offset
    found.components = []
    for component_words in words:
        options, rest = split_options(component_words, source="script", extra_long=extra_long)
        if rest and found.error is None:
            found.error = f"invalid directive {rest[0]!r}"
        found.components.append(options)
    return found

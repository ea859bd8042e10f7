"""``horus-sbatch``: placeholder until the horus-sbatch issue lands; passes everything to sbatch."""

import os
import shutil
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        sys.stderr.write("horus-sbatch: sbatch not found on PATH\n")
        sys.exit(127)
    os.execv(sbatch, ["sbatch", *argv])

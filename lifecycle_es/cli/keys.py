"""``lifecycle-es keygen``: an Ed25519 key pair for signed checkpoints, as ssh-keygen makes one.

    lifecycle-es keygen ops.key                     ops.key (private, 0600) and ops.key.pub (public)
    lifecycle-es keygen ops.key --name ops.example  the name the signature lines carry

The private key signs checkpoints (``seal --sign``, ``host --sign``) and stays with the log's
operator; the public key is what an auditor is handed (``audit --trust``). Neither file is ever
overwritten (exit 73), and the private key's bytes are never printed.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from lifecycle_es.files import text_path

from .exits import EXIT_CANTCREAT, EXIT_OK, CommandError, printable


def register(subparsers: Any) -> None:
    """Add the ``keygen`` subcommand."""
    keygen = subparsers.add_parser(
        "keygen", help="make an Ed25519 key pair for signed checkpoints: FILE (private, 0600) and FILE.pub",
        description="Write a new Ed25519 private key to FILE (mode 0600, never over an existing file or through a "
                    "link) and its public key to FILE.pub, both in the text form of Go's note package (C2SP "
                    "signed-note). Sign checkpoints with FILE; hand FILE.pub to auditors.")
    keygen.add_argument("file", metavar="FILE", help="where the private key goes (FILE.pub gets the public key)")
    keygen.add_argument("--name", default="lifecycle-es",
                        help="the key's name, carried by every signature line (default: %(default)s)")
    keygen.set_defaults(run=run_keygen)


def run_keygen(args: argparse.Namespace) -> int:
    """Write the key pair and print the public key."""
    from lifecycle_es.signing import generate_key

    path = text_path(args.file, "FILE")
    for each in (path, path + ".pub"):
        if os.path.lexists(each):
            raise CommandError(EXIT_CANTCREAT, f"{each!r} exists; a key is never overwritten")
    verifier = generate_key(path, name=args.name)
    print(printable(f"wrote the private key to {path} (0600: keep it with the log's operator) and the public key "
                    f"to {path}.pub (hand it to auditors):"))
    print(printable(verifier.text))
    return EXIT_OK

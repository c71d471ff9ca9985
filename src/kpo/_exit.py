"""Exit statuses that kpo's commands and the engines they call share (the command line's own are in
:mod:`kpo.cli`, a file system fault's in :mod:`kpo._files`)."""

INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C

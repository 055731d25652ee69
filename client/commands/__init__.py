"""`fromscratch files|jobs|models ...`: the command-line client of a running fromscratch server.

Every command takes `--server` (env FROMSCRATCH_SERVER, default http://127.0.0.1:8000) and
`--api-key` (env FROMSCRATCH_API_KEY), and talks only to the public /v1 API through client.http.

Output conventions: commands that create something print its id alone on stdout (so
`FILE=$(fromscratch files upload data.txt)` works) and the human details on stderr; list and show
commands print a table (on a terminal; anywhere else tab-separated lines of the full values, a header
line first), or the API's JSON with `--json`. Progress goes to stderr: a live bar on a terminal,
plain lines as things happen otherwise.
Exit codes: 0 ok; 1 an API or network error (printed as one line); 2 bad usage;
`jobs follow`: 1 when the job failed, 3 when it was cancelled, 130 on Ctrl-C (the job goes on).

Modules: `registration` (the argparse tree; `register` is what cli/main.py calls), `runner` (exit
codes, usage errors, the server connection, error handling), `output` (consoles, JSON, table
cells, tables), `files`, `jobs` and `models` (the commands), `follow` and `follow_display` (the live
progress of `jobs follow`). Unknown options get "did you mean" (cli/parser.py).
jobs create's hyperparameter options are in client.hyperparameter_options.
"""

from __future__ import annotations

from client.commands.follow import follow_job
from client.commands.registration import register

__all__ = ["follow_job", "register"]

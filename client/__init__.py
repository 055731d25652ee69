"""The fromscratch client: `client.http` (an HTTP client of the public /v1 API) and
`client.commands` (the `fromscratch files|jobs|models` commands built on it).

Nothing here imports the server (api/) or torch, so the client installs and starts light; it uses
only core.status (the job statuses), core.exports (the download formats) and trainer.config (the
preset names, hyperparameters and export dtypes).
"""

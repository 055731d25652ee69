"""One training run: `setup.start_run` builds a `state.TrainRun`, `loop.train` advances it with
`step.OptimizerStep`, evaluating and checkpointing in between. `collectives` and `fsdp` are what the
loop uses inside a process group; `precision` picks dtype and compile."""

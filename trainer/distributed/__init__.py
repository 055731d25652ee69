"""One run over several processes: `launch.launch_train` starts them through torchrun's launcher,
and `callback_relay` brings rank 0's callbacks back to the launching process. What the ranks do
inside the loop is in trainer.run.collectives."""

"""fromscratch's trainer: a pure-torch library (no web, SQL or Celery imports; a test enforces it).

Its packages are layered; a module imports only from its own layer or the ones below
(tests/trainer/test_layers.py checks it, and that no import cycle exists):

    config/       the one schema of hyperparameters, its errors, derived forms and estimates (no torch)
    model/        the Llama, its fused element-wise ops and their CPU kernels
    data/         tokenizers, file formats, loss spans, tokenized data and batch sampling
    optim/        AdamW, L-BFGS and the learning-rate schedule
    checkpoint    safetensors + JSON checkpoints (checkpoint_snapshot: captured now, written later)
    run/          one training run: set-up, the step, the loop, evaluation, precision, collectives
    distributed/  the launcher of a run over several processes, and the callbacks relayed from them
    export/       GGUF, Hugging Face and ONNX exports;  sampling: text generation
    cli           `fromscratch train | sample | export`

Import what you need from its module (`from trainer.run.loop import train`); `import trainer`
imports nothing heavy.
"""

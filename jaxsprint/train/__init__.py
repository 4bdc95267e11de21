"""Synchronous large-batch training: data, models, the sharded trainer, checkpoints, Final Polishing.

Modules: `data` (datasets), `pipeline` (grain pipelines, augmentation), `models` (the ResNet family and its
BatchNorm), `parallel` (mesh, shardings), `optim` (recipes and schedules), `trainer` (TrainState, step
factories, the loop, the NaN guard), `run_config` (a resume's config against the run's), `checkpoint` (orbax,
one layout), `metrics` (JSONL and TensorBoard), `polish` (BatchNorm statistics recomputed on un-augmented
data), `settings` (the config's checks), `memory` (the memory estimate), `cpu` (the optional CPU acceleration
behind one switch).

    from jaxsprint.train import trainer
    trainer.train_and_evaluate(config, workdir)
"""

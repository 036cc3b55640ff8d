"""configs layer: a Plan as the files other tools run, and those files read back into a Plan.

One module per format, each writing and reading it: ``_advisor_yaml`` (advisor.yaml, also HF sections
and flat TrainingArguments files), ``_axolotl``, ``_llamafactory``, ``_trl``, ``_deepspeed`` (deepspeed.json,
and the offload of a DeepSpeed config), ``_train_script`` (train.py). What they share: ``_base`` (the
Plan ↔ library vocabulary, file writing, ``load_mapping`` / ``detect_format`` / ``Collect``),
``_training_args`` (TrainingArguments' optimizer and checkpointing keys) and ``_keys`` (the keys the
knobs declare for each format: advisor.core.knobs). Entry points: ``read.read_config`` and
``export.export_plan``.
"""

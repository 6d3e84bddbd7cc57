"""The data stages, one file per ``dvc.yaml`` stage, each with one ``run(params, ...)``."""

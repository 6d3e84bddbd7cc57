"""Every setting of the data stages, typed and checked: the sections of ``params.yaml`` and the mixing spec."""

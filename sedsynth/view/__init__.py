"""``sedsynth view``: a local web page to browse a dataset, hear each mixture with its labels, query the detector and walk the evaluation's errors.

:mod:`sedsynth.view.catalog` reads a shard or mixtures folder's metadata, :mod:`sedsynth.view.evaluation`
an evaluation folder, :mod:`sedsynth.view.querying` draws spectrograms and runs text queries through the
detector ``sedsynth detect`` uses, :mod:`sedsynth.view.server` is the aiohttp application, and
:mod:`sedsynth.view.command` the command; the page itself (plain JavaScript, no library) is in ``static/``.
"""

"""The run of `python -m mutual.analyze` (`runner`): every class of a dataset through the
per-class pipeline, its reports and figures."""

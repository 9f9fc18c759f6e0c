"""The run of `python -m mutual.evaluate` (`runner`): the paper's evaluation protocols
(`mutual.protocols`) over one analysis."""

"""The shared CLIP layer every feature builds on: `load` a checkpoint into a `CLIPBundle`
(`loading`, `bundle`), CLIP's image transform (`preprocess`), and encoding many images or texts
in fixed-size batches (`encoding`)."""

"""The data layer every feature reads through: the synthetic attribute world (`synthetic`,
`synthetic_tasks`), image folders (`folders`), decoding and sizing images (`images`), CLIP's image transform
(`preprocess`), CoOp's
datasets (`coop`), TFDS (`tfds`), labelled splits and K-shot sampling (`splits`), attribute
tables (`attributes`), CUB-200-2011 as one table (`cub`), users' small files and class names
(`files`), JSON downloads (`download`)."""

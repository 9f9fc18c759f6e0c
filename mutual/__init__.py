"""Mutual-knowledge analysis of CLIP zero-shot predictions (Sammani & Deligiannis, NeurIPS 2024).

Built on stori_jax's models; stori_jax never imports this package.
"""

# Vision side: features, prominent patches, CRF, concepts and visual prompts.
from mutual.concepts import kmeans_concepts, pca_concepts
from mutual.crf import refine
from mutual.features import image_embeddings, patch_features
from mutual.foreground import prominent_patches, upsample_mask
from mutual.visual_prompts import concept_embeddings, render_prompts

"""The interactive preference-retrieval explorer (the paper's Figure 1), as a library.

`python -m stori_jax.explore` is its command. One module per part:

* `limits`: what a request may ask for (weights, lengths, body size) and the /api/rank check.
* `ranking`: `Explorer`, word-weighted prompts -> the top k of the image index (one jitted
  matmul + top k per change; only the text is encoded).
* `curves`: App. B's per-category curves, when the index has attribute labels.
* `world`, `folder`: the index's images, the synthetic world (labelled) or an image folder.
* `index`: `build_explorer`, the model and the cached image index -> an `Explorer`.
* `app`: the Flask app (page, JSON API, thumbnails, the Host/Origin allowlist); the page is
  package data, `page.html`.
* `server`: `serve`, the loopback server the command runs.

Flask is an optional dependency (the `explore` extra); only `app` and `server` need it.
"""

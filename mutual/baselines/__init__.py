"""The trained baselines of Tables 1 and 5 (Sammani & Deligiannis 2024, App. D), on cached features.

All see the same training images as the analysis's model encodes them (`cache`: the patch
features of config.analysis.feature_kind and the image embeddings, from one tower pass) and the
same descriptor bank, and are trained with optax (Adam, learning rate decayed by a cosine
schedule, App. D: batch 64, 1e-4 to 1e-5, q = 512 on ImageNet) in the project's training loop
(`fitting`). One module per baseline:

* `bottleneck`: MM-CBM and MM-ProtoSim (App. D.1), one model whose attention is a softmax over
  the tokens (MM-CBM) or a hard Gumbel assignment of each token to a descriptor (MM-ProtoSim).
* `feature_maps`: Feature Maps (App. D.2): the channels of largest norm as concepts, and the
  concept labeler that names them (its top-all / top-10 accuracy: App. D.2).
* `standard`: Table 5's Standard row, an MLP on the image embedding.
* `lf_cbm`: Table 5's LF-CBM row as its authors' code builds it, GLM-SAGA ported to JAX.
* `suite`: all of them trained together (`train_all`), and the trained set (`Baselines`:
  Table 5's classifiers and the labeler's scores, Table 1's explanations).

Choices the paper leaves open: the 1 / sqrt(q) attention scaling; values = keys (App. D says
K = V); the token average (rather than sum) of the hard-assigned values in MM-ProtoSim; how an
attention map becomes a region (min-max normalised, kept above `region_threshold`); the labeler's
architecture and DropBlock's rate and block size; the Standard MLP's input and layers; LF-CBM's
concepts (the descriptor bank D, unfiltered: the MK paper's reading), backbone (the analysed
CLIP's own image embedding) and held-out split (`paper_config.LF_CBM_DEFAULTS`). `explain`
explains the class given to it: the evaluation passes CLIP's zero-shot prediction so that every
explanation in Table 1 explains the same decision.

Callers import the modules (`from mutual.baselines import suite`); a test that patches a function
patches it in the module that holds it (`fitting.fit`), where its callers look it up.
"""

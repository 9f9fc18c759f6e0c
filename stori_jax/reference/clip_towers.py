"""PyTorch reference models (open_clip, transformers) for numerics parity.

Needs the `[torch]` extra. Builds the reference of a CLIPConfig with random or
given weights and runs it, returning the same quantities the Flax towers give:
every block's hidden states, the features and the logits.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from stori_jax.models import CLIPConfig, tower_kinds

REFERENCES = ("open_clip", "transformers")


def _torch():
  try:
    import torch  # optional: the torch extra
  except ImportError as e:
    raise ImportError("The PyTorch reference needs torch: pip install -e '.[torch]'") from e
  return torch


def _check_one_activation(config: CLIPConfig, reference: str):
  if not tower_kinds.of(config.vision).shares_activation:
    return  # CNN towers have their own activations; quick_gelu sets the text tower's.
  if config.text.activation != config.vision.activation and reference == "open_clip":
    raise ValueError(
      "open_clip uses one activation for both towers; this config mixes "
      f"{config.text.activation} and {config.vision.activation}."
    )


def _kind_hook(config: CLIPConfig, hook: str):
  return tower_kinds.of(config.vision).hook(hook)


def build_open_clip(config: CLIPConfig):
  """An open_clip CLIP (random init) with exactly this architecture."""
  _check_one_activation(config, "open_clip")
  from open_clip.model import CLIP  # optional: the torch extra

  t = config.text
  vision_cfg = _kind_hook(config, "reference_vision_cfg")(config)
  text_cfg = dict(
    context_length=t.context_length,
    vocab_size=t.vocab_size,
    width=t.width,
    heads=t.heads,
    layers=t.layers,
    mlp_ratio=t.mlp_width / t.width,
  )
  if config.layer_norm_eps != 1e-5:
    text_cfg["norm_kwargs"] = {"eps": config.layer_norm_eps}
  model = CLIP(
    config.embed_dim, vision_cfg, text_cfg, quick_gelu=config.text.activation == "quick_gelu"
  )
  finish = tower_kinds.of(config.vision).hooks.get("reference_finish")
  if finish is not None:
    finish(model, config)
  return model.eval()


def build_transformers(config: CLIPConfig):
  """A transformers CLIPModel (random init) with exactly this architecture."""
  import transformers  # optional: the torch extra

  t = config.text
  hf_config = transformers.CLIPConfig(
    text_config=dict(
      vocab_size=t.vocab_size,
      hidden_size=t.width,
      intermediate_size=t.mlp_width,
      num_hidden_layers=t.layers,
      num_attention_heads=t.heads,
      max_position_embeddings=t.context_length,
      hidden_act=t.activation,
      layer_norm_eps=config.layer_norm_eps,
      eos_token_id=t.eot_token_id,
      bos_token_id=t.eot_token_id - 1,
      pad_token_id=0,
    ),
    vision_config=_kind_hook(config, "reference_transformers_vision")(config),
    projection_dim=config.embed_dim,
  )
  return transformers.CLIPModel(hf_config).eval()


def build(config: CLIPConfig, reference: str = "open_clip", seed: int | None = None):
  """The reference library's model of `config`, randomly initialised; with `seed`, the same
  initialisation in every process (torch's global generator is left as it was)."""
  if reference not in REFERENCES:
    raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}.")
  make = build_open_clip if reference == "open_clip" else build_transformers
  if seed is None:
    return make(config)
  torch = _torch()
  with torch.random.fork_rng(devices=[]):
    torch.manual_seed(seed)
    return make(config)


def randomize_(model, seed: int = 0, scale: float = 0.02):
  """Adds N(0, scale) noise to every parameter (logit_scale aside), in place.

  Fresh initialisations leave LayerNorm scales at 1 and many biases at 0, which
  would hide a wrongly mapped tensor; noise makes every tensor count. Batch-norm
  running statistics are perturbed too (means shifted, variances scaled by
  factors in [0.5, 2)), so the inference-mode normalisation is tested.
  """
  torch = _torch()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "logit_scale" not in name:
        param.add_(scale * torch.randn(param.shape, generator=generator))
    for name, buffer in model.named_buffers():
      if name.endswith("running_mean"):
        buffer.add_(10 * scale * torch.randn(buffer.shape, generator=generator))
      elif name.endswith("running_var"):
        buffer.mul_(0.5 + 1.5 * torch.rand(buffer.shape, generator=generator))
  return model


def state_dict_numpy(model) -> dict[str, np.ndarray]:
  return {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}


def _hook_hidden(first, modules, store, fix):
  hooks = []
  if first is not None:
    hooks.append(
      first.register_forward_pre_hook(lambda _m, args: store.append(fix(args[0]).numpy().copy()))
    )
  for module in modules:
    hooks.append(
      module.register_forward_hook(lambda _m, _args, out: store.append(fix(out).numpy().copy()))
    )
  return hooks


def _run_open_clip(model, images, ids):
  torch = _torch()
  hidden = {"text": [], "vision": []}
  batch_first = getattr(model.transformer, "batch_first", True)
  seq_fix = (lambda x: x) if batch_first else (lambda x: x.permute(1, 0, 2))
  fixes = {"sequence": seq_fix, "nchw": lambda x: x.permute(0, 2, 3, 1)}
  towers = [("text", model.transformer.resblocks[0], model.transformer.resblocks, seq_fix)]
  stages = tower_kinds.detect("reference_hidden", model.visual)
  if stages is None:
    raise ValueError(f"No tower kind's reference_hidden hook takes {type(model.visual).__name__}.")
  first, modules, layout = stages
  towers.append(("vision", first, modules, fixes[layout]))
  hooks = []
  for tower, first, modules, fix in towers:
    hooks += _hook_hidden(first, modules, hidden[tower], fix)
  try:
    with torch.no_grad():
      image_features = model.encode_image(images)
      text_features = model.encode_text(ids)
      logit_scale = model.logit_scale.exp()
  finally:
    for hook in hooks:
      hook.remove()
  return image_features, text_features, logit_scale, hidden


def _run_transformers(model, images, ids):
  torch = _torch()
  with torch.no_grad():
    text = model.text_model(input_ids=ids, output_hidden_states=True)
    vision = model.vision_model(pixel_values=images, output_hidden_states=True)
    text_features = model.text_projection(text.pooler_output)
    image_features = model.visual_projection(vision.pooler_output)
    logit_scale = model.logit_scale.exp()
  hidden = {
    "text": [h.numpy() for h in text.hidden_states],
    "vision": [h.numpy() for h in vision.hidden_states],
  }
  return image_features, text_features, logit_scale, hidden


def run(model, images_nhwc: np.ndarray, ids: np.ndarray) -> Mapping[str, object]:
  """Runs a reference model in fp32.

  Args:
    images_nhwc: float32 [B, S, S, 3], normalised.
    ids: int [B, L] token ids (EOT must be the largest id of each row, as
      open_clip pools at the argmax).

  Returns dict: image_features [B, E], text_features [B, E], logits
  [B_images, B_texts], text_hidden / vision_hidden: lists of [B, L, W]
  (CNN image towers: the stem and stage outputs, NHWC).
  """
  torch = _torch()
  images = torch.from_numpy(np.ascontiguousarray(images_nhwc.transpose(0, 3, 1, 2)))
  ids = torch.from_numpy(np.asarray(ids, np.int64))
  runner = _run_transformers if hasattr(model, "text_model") else _run_open_clip
  image_features, text_features, logit_scale, hidden = runner(model, images, ids)
  image_n = image_features / image_features.norm(dim=-1, keepdim=True)
  text_n = text_features / text_features.norm(dim=-1, keepdim=True)
  return {
    "image_features": image_features.numpy(),
    "text_features": text_features.numpy(),
    "logits": (logit_scale * image_n @ text_n.T).numpy(),
    "text_hidden": hidden["text"],
    "vision_hidden": hidden["vision"],
  }

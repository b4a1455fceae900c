"""The keras_hub part of the Keras zoo: every backbone class keras_hub exports, and a few task models, built from tiny configs (no presets, no downloads).

A backbone's constructor arguments are taken by name from one pool of small
values (``_POOL``: vocabulary 50, 2 layers, 2 heads, width 16, ...), with a
few classes' own small values on top (``_OWN``: image shapes, stage lists).
A class whose required arguments the pool does not hold (sub-models such as
``vision_encoder``, long per-stage lists) is not built: ``Build`` raises
NotBuiltError naming them, and the zoo's table says so.

``Build(name, randomness=False)`` sets every constructor argument whose name
says dropout to 0 (the exact comparison with Keras); ``randomness=True``
keeps the class's defaults (its real settings: GPT-2's 0.1). A MoE
backbone keeps its router auxiliary loss coefficient (keras_hub's default,
0.001 for Qwen-MoE): the loss it adds with ``add_loss`` in training is in
the pipeline's loss and in Keras's step alike (docs/keras.md).
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ['INPUTS', 'LENGTHS', 'NotBuiltError', 'Build', 'Names', 'TASKS']

# Task models: (task class, its backbone class, extra task arguments).
TASKS = {
    'GPT2CausalLM': ('GPT2Backbone', {}),
    'BertTextClassifier': ('BertBackbone', {'num_classes': 3}),
    'LlamaCausalLM': ('LlamaBackbone', {}),
    'ViTImageClassifier': ('ViTBackbone', {'num_classes': 3}),
}

SEQ = 8  # Tokens per example.
_IMAGE = (16, 16, 3)

_POOL = dict(
    vocabulary_size=50, vocab_size=50, num_layers=2, num_heads=2,
    num_query_heads=2, num_key_value_heads=1, num_attention_heads=2,
    hidden_dim=16, intermediate_dim=32, head_dim=8, head_size=8,
    embedding_dim=16, max_sequence_length=16, num_experts=2, top_k=2,
    moe_intermediate_dim=16, shared_expert_intermediate_dim=16,
    shared_expert_intermediate_size=16, num_layers_enc=2, num_layers_dec=2,
    num_groups=1, num_inner_repetitions=1, image_shape=_IMAGE,
    patch_size=4, mlp_dim=32)

# SmolLM and SmolLM3 take every attention setting as a required argument.
_SMOLLM = dict(attention_bias=False, attention_dropout=0.1,
               rope_layer_enabled_list=[True, True],
               layer_types=['attention', 'attention'], mlp_bias=False,
               layer_norm_epsilon=1e-6, max_position_embeddings=32,
               rope_theta=10000.0, partial_rotary_factor=1.0)

# T5Gemma's encoder and decoder at width 16 (T5Gemma2 takes them too).
_T5GEMMA = dict(
    encoder_hidden_dim=16, encoder_intermediate_dim=32, encoder_num_layers=2,
    encoder_num_attention_heads=2, encoder_num_key_value_heads=1,
    encoder_head_dim=8,
    encoder_layer_types=['sliding_attention', 'full_attention'],
    decoder_hidden_dim=16, decoder_intermediate_dim=32, decoder_num_layers=2,
    decoder_num_attention_heads=2, decoder_num_key_value_heads=1,
    decoder_head_dim=8,
    decoder_layer_types=['sliding_attention', 'full_attention'],
    sliding_window=4, cross_attention_hidden_size=16)

_OWN = {
    'DINOV2Backbone': dict(patch_size=14, image_shape=(28, 28, 3)),
    'DINOV3Backbone': dict(patch_size=16, image_shape=(32, 32, 3)),
    'VGGBackbone': dict(stackwise_num_repeats=[1, 1],
                        stackwise_num_filters=[4, 8]),
    # keras_hub's basic block needs 64 filters in and out of stage one.
    'ResNetBackbone': dict(input_conv_filters=[64], input_conv_kernel_sizes=[3],
                           stackwise_num_filters=[64, 8],
                           stackwise_num_blocks=[1, 1],
                           stackwise_num_strides=[1, 2],
                           block_type='basic_block'),
    'DenseNetBackbone': dict(stackwise_num_repeats=[1, 1], growth_rate=2),
    'MiTBackbone': dict(layerwise_depths=[1, 1], image_shape=(32, 32, 3),
                        hidden_dims=[4, 8], layerwise_num_heads=[1, 2],
                        layerwise_sr_ratios=[8, 4], max_drop_path_rate=0.0,
                        layerwise_patch_sizes=[7, 3],
                        layerwise_strides=[4, 2]),
    # The ratios are keras_hub's own test's (cspnet_backbone_test.py).
    'CSPNetBackbone': dict(stem_filters=8, stem_kernel_size=3, stem_strides=1,
                           stackwise_strides=2, stackwise_depth=[1, 1],
                           stackwise_num_filters=[8, 16], down_growth=True,
                           bottle_ratio=(0.5, 1.0), block_ratio=(1.0, 0.5),
                           expand_ratio=(2.0, 1.0), stem_padding='same',
                           block_type='dark_block', stage_type='csp'),
    'EfficientNetBackbone': dict(
        stackwise_kernel_sizes=[3, 3], stackwise_num_repeats=[1, 1],
        stackwise_input_filters=[8, 8], stackwise_output_filters=[8, 16],
        stackwise_expansion_ratios=[1, 4],
        stackwise_squeeze_and_excite_ratios=[0.0, 0.25],
        stackwise_strides=[1, 2], stackwise_block_types=['fused', 'unfused'],
        stackwise_force_input_filters=[0, 0],
        stackwise_nores_option=[False, False], num_features=32,
        stackwise_width_coefficients=[1.0, 1.0],
        stackwise_depth_coefficients=[1.0, 1.0], input_shape=_IMAGE),
    'HGNetV2Backbone': dict(
        embedding_size=8, stem_channels=[3, 4, 8], hidden_act='relu',
        use_learnable_affine_block=False, depths=[1, 1], hidden_sizes=[16, 32],
        stackwise_stage_filters=[[8, 4, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
        apply_downsample=[False, True],
        use_lightweight_conv_block=[False, False]),
    'VideoPrismBackbone': dict(num_frames=2, num_spatial_layers=1,
                               num_temporal_layers=1, num_auxiliary_layers=1),
    'T5GemmaBackbone': _T5GEMMA,
    'SegFormerBackbone': dict(projection_filters=8),
    'DeepLabV3Backbone': dict(low_level_feature_key='P2',
                              spatial_pyramid_pooling_key='P4',
                              dilation_rates=[1, 2], upsampling_size=4,
                              projection_filters=8, image_shape=(32, 32, 3)),
    'BASNetBackbone': dict(num_classes=1, image_shape=(32, 32, 3)),
    'RetinaNetBackbone': dict(min_level=3, max_level=5, use_p5=True,
                              image_shape=(32, 32, 3)),
    'MobileNetBackbone': dict(
        stackwise_expansion=[[16], [24]], stackwise_num_blocks=[1, 1],
        stackwise_num_filters=[[8], [16]], stackwise_kernel_size=[[3], [3]],
        stackwise_num_strides=[[2], [1]], stackwise_se_ratio=[[None], [0.25]],
        stackwise_activation=[['relu'], ['hard_swish'], ['hard_swish']],
        stackwise_padding=[[1], [1]], output_num_filters=32,
        input_num_filters=8, depthwise_filters=8, depthwise_stride=2,
        depthwise_residual=False, squeeze_and_excite=0.5,
        last_layer_filter=32, image_shape=(32, 32, 3)),
    'CLIPBackbone': dict(projection_dim=16),
    'MetaCLIP2Backbone': dict(projection_dim=16),
    'SwinTransformerBackbone': dict(embed_dim=8, depths=[1, 1],
                                    num_heads=[2, 2], window_size=2,
                                    image_shape=(16, 16, 3), patch_size=2),
    'FalconBackbone': dict(num_attention_heads=2),
    'RWKV7Backbone': dict(hidden_size=16, head_size=8),
    'ViTDetBackbone': dict(hidden_size=16, global_attention_layer_indices=[1],
                           image_shape=(32, 32, 3), patch_size=8,
                           window_size=2, num_upscale_channels=[8],
                           use_rel_pos=True),
    'SmolLMBackbone': _SMOLLM,
    'SmolLM3Backbone': _SMOLLM,
    'PaliGemmaBackbone': dict(image_size=16, vit_patch_size=4, vit_num_heads=2,
                              vit_hidden_dim=16, vit_num_layers=1),
    'Gemma3Backbone': dict(image_size=16, vision_encoder=None),
    'Gemma4Backbone': dict(image_size=16, vision_encoder=None),
    'MoonshineBackbone': dict(filter_dim=16, encoder_num_layers=1,
                              decoder_num_layers=1, encoder_num_heads=2,
                              decoder_num_heads=2),
    # keras_hub's t5gemma2_backbone_test.py at width 16.
    'T5Gemma2Backbone': dict(
        _T5GEMMA, rms_norm_eps=1e-6, tie_word_embeddings=True,
        query_pre_attn_scalar=1.0, attention_bias=False,
        hidden_activation='gelu_approximate', attn_logit_softcapping=50.0,
        rope_max_wavelength=10000.0, initializer_range=0.04,
        use_query_key_norm=True),
    # keras_hub's gemma3n_backbone_test.py, text only (its vision and audio
    # encoders are optional).
    'Gemma3nBackbone': dict(
        text_vocab_size=50, text_hidden_size=4, num_hidden_layers=1,
        pad_token_id=0, num_attention_heads=1, num_key_value_heads=1,
        head_dim=4, intermediate_size=[8],
        hidden_activation='gelu_approximate', layer_types=['full_attention'],
        sliding_window=4, rope_theta=10000.0, max_position_embeddings=SEQ,
        vocab_size_per_layer_input=50, hidden_size_per_layer_input=2,
        altup_num_inputs=2, laurel_rank=1),
    'StableDiffusion3Backbone': dict(
        mmdit_patch_size=2, mmdit_hidden_dim=16, mmdit_num_layers=1,
        mmdit_num_heads=2, mmdit_position_size=32, mmdit_qk_norm=None,
        mmdit_dual_attention_indices=None, image_shape=(16, 16, 3)),
    # keras_hub's flux_backbone_test.py at width 32, one block of each kind.
    'FluxBackbone': dict(input_channels=16, hidden_size=32, mlp_ratio=2.0,
                         num_heads=2, depth=1, depth_single_blocks=1,
                         axes_dim=[4, 6, 6], theta=10_000, use_bias=True,
                         guidance_embed=True, image_shape=(SEQ, 16),
                         text_shape=(SEQ, 16), image_ids_shape=(SEQ, 3),
                         text_ids_shape=(SEQ, 3), y_shape=(16,)),
    # keras_hub's mobilenetv5_backbone_test.py.
    'MobileNetV5Backbone': dict(
        stackwise_block_types=[['er'], ['uir', 'uir']],
        stackwise_num_blocks=[1, 2], stackwise_num_filters=[[8], [16, 16]],
        stackwise_strides=[[2], [2, 1]],
        stackwise_act_layers=[['relu'], ['relu', 'relu']],
        stackwise_exp_ratios=[[4.0], [6.0, 6.0]],
        stackwise_se_ratios=[[0.0], [0.0, 0.0]],
        stackwise_dw_kernel_sizes=[[0], [5, 5]],
        stackwise_dw_start_kernel_sizes=[[0], [0, 0]],
        stackwise_dw_end_kernel_sizes=[[0], [0, 0]],
        stackwise_exp_kernel_sizes=[[3], [0, 0]],
        stackwise_pw_kernel_sizes=[[1], [0, 0]],
        stackwise_num_heads=[[0], [0, 0]], stackwise_key_dims=[[0], [0, 0]],
        stackwise_value_dims=[[0], [0, 0]], stackwise_kv_strides=[[0], [0, 0]],
        stackwise_use_cpe=[[False], [False, False]], image_shape=(32, 32, 3),
        stem_size=8, use_msfa=False),
    'XceptionBackbone': dict(stackwise_conv_filters=[[8, 8], [16, 16]],
                             stackwise_pooling=[True, False]),
}
_ABSTRACT = ('Backbone', 'FeaturePyramidBackbone')
# The length of an input's unknown dimension other than the batch, by model
# class and input name, where SEQ is too short: Moonshine's audio samples
# pass convolutions of kernel 127, stride 64, then 7/3 and 3/2. (By class:
# BART's encoder_padding_mask is a token mask of SEQ.)
LENGTHS = {'MoonshineBackbone': {'encoder_input_values': 1024,
                                 'encoder_padding_mask': 1024},
           # No mask prompts (keras_hub's sam_backbone_test feeds 0).
           'SAMBackbone': {'masks': 0},
           # keras_hub 0.32.0's SAM3 geometry encoder hands its (batch,
           # boxes + 1) prompt mask to attention unexpanded, so Keras runs
           # it only where boxes + 1 is the batch of the call (or 1): 3
           # boxes for micro-batches of 4 (docs/keras.md).
           'SAM3PromptableConceptBackbone': {'boxes': 3, 'box_labels': 3}}


def _Sam3Boxes(shape: list[int], per_call: int, seed: int) -> Any:
  """SAM3 box prompts (image row, cx, cy, w, h) for `per_call` examples a
  call: the row, which roi_align gathers from, is the image's within its
  own call (its micro-batch), the box inside the image."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n, boxes = shape[0], shape[1]
  row = tf.cast(tf.range(n) % per_call, tf.float32)
  row = tf.broadcast_to(row[:, None, None], [n, boxes, 1])
  where = tf.random.stateless_uniform([n, boxes, 4], [seed, 3], 0.2, 0.6)
  return tf.concat([row, where], -1)


def _Sam3Labels(shape: list[int], per_call: int, seed: int) -> Any:
  """SAM3 box labels, 0 or 1 (negative or positive; none is padding)."""
  del per_call
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.random.stateless_uniform(shape, [seed, 4], 0, 2, tf.int32)


# Inputs a random draw would make invalid, by model class and input name:
# (shape, examples per call, seed) -> the tensor.
INPUTS = {'SAM3PromptableConceptBackbone': {'boxes': _Sam3Boxes,
                                            'box_labels': _Sam3Labels}}


def _ResNet(stages: int, filters: int = 8) -> Any:
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.ResNetBackbone(
      input_conv_filters=[64], input_conv_kernel_sizes=[3],
      stackwise_num_filters=[64] + [filters] * (stages - 1),
      stackwise_num_blocks=[1] * stages,
      stackwise_num_strides=[1] + [2] * (stages - 1), block_type='basic_block')


def _Encoders(prefix: str, projection: bool = False) -> dict[str, Any]:
  """A tiny vision and text encoder pair (CLIP, SigLIP, MetaCLIP2)."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  vision = getattr(keras_hub.models, prefix + 'VisionEncoder')
  text = getattr(keras_hub.models, prefix + 'TextEncoder')
  return dict(
      vision_encoder=vision(4, 16, 2, 2, 32, image_shape=_IMAGE),
      text_encoder=text(50, 16, 16, 2, 2, 32, max_sequence_length=SEQ))


def _MiT() -> Any:
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.MiTBackbone(**dict(_OWN['MiTBackbone'],
                                             num_layers=2))


def _Sam() -> dict[str, Any]:
  """keras_hub's sam_backbone_test.py sub-models, 2 layers and 2 heads."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam import sam_mask_decoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam import sam_prompt_encoder  # pylint: disable=g-import-not-at-top
  return dict(
      image_encoder=keras_hub.models.ViTDetBackbone(
          hidden_size=16, num_layers=2, intermediate_dim=64, num_heads=2,
          global_attention_layer_indices=[1], patch_size=16,
          num_output_channels=8, window_size=2, image_shape=(16, 16, 3)),
      prompt_encoder=sam_prompt_encoder.SAMPromptEncoder(
          hidden_size=8, image_embedding_size=(8, 8),
          input_image_size=(16, 16), mask_in_channels=16),
      mask_decoder=sam_mask_decoder.SAMMaskDecoder(
          num_layers=2, hidden_size=16, intermediate_dim=32, num_heads=8,
          embedding_dim=8, num_multimask_outputs=3, iou_head_depth=3,
          iou_head_hidden_dim=8))


def _Sam3() -> dict[str, Any]:
  """keras_hub's sam3_pc_backbnoe_test.py (sic) sub-models, vocabulary 50."""
  from keras_hub.src.models.sam3 import sam3_detr_decoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam3 import sam3_detr_encoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam3 import sam3_geometry_encoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam3 import sam3_mask_decoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam3 import sam3_text_encoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.sam3 import sam3_vision_encoder  # pylint: disable=g-import-not-at-top
  image, width = (28, 28, 3), dict(num_layers=2, hidden_dim=16,
                                   intermediate_dim=32, num_heads=2)
  return dict(
      vision_encoder=sam3_vision_encoder.SAM3VisionEncoder(
          image_shape=image, patch_size=14, fpn_hidden_dim=16,
          fpn_scale_factors=[4.0, 2.0, 1.0, 0.5],
          pretrain_image_shape=(42, 42, 3), window_size=2,
          global_attn_indexes=[1, 2], **width),
      text_encoder=sam3_text_encoder.SAM3TextEncoder(
          vocabulary_size=50, embedding_dim=16, **width),
      geometry_encoder=sam3_geometry_encoder.SAM3GeometryEncoder(
          roi_size=7, **width),
      detr_encoder=sam3_detr_encoder.SAM3DetrEncoder(**width),
      detr_decoder=sam3_detr_decoder.SAM3DetrDecoder(
          image_shape=image, patch_size=14, num_queries=8, **width),
      mask_decoder=sam3_mask_decoder.SAM3MaskDecoder(
          num_upsampling_stages=3, hidden_dim=16, num_heads=2))


def _Blip2() -> dict[str, Any]:
  """keras_hub's blip2_backbone_test.py sub-models."""
  from keras_hub.src.models.blip2 import blip2_custom_opt  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.blip2 import blip2_qformer  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.blip2 import blip2_vision_encoder  # pylint: disable=g-import-not-at-top
  return dict(
      vision_encoder=blip2_vision_encoder.BLIP2VisionEncoder(
          image_size=16, patch_size=4, num_layers=2, num_heads=2,
          hidden_dim=8, intermediate_dim=16, use_patch_bias=True,
          use_class_token=True, use_mha_bias=True, use_mlp_bias=True,
          dropout_rate=0.0, layer_norm_epsilon=1e-6, initializer_range=0.02),
      qformer=blip2_qformer.BLIP2QFormer(
          num_query_tokens=2, num_layers=2, num_heads=2, hidden_dim=4,
          intermediate_dim=8, vision_dim=8, cross_attention_frequency=1,
          dropout=0.0, layer_norm_epsilon=1e-6),
      language_model=blip2_custom_opt.BLIP2CustomOPT(
          vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=4,
          intermediate_dim=8, num_query_tokens=2, qformer_hidden_dim=4,
          max_sequence_length=16, dropout=0.0, language_projection=None))


def _DepthAnything() -> dict[str, Any]:
  """keras_hub's depth_anything_backbone_test.py, a narrower neck."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  return dict(
      image_encoder=keras_hub.models.DINOV2Backbone(
          14, 4, 16, 2, 64, 1.0, 0, image_shape=(126, 126, 3),
          apply_layernorm=True, name='image_encoder'),
      reassemble_factors=[4, 2, 1, 0.5], neck_hidden_dims=[4, 8, 8, 16],
      fusion_hidden_dim=16, head_hidden_dim=8, head_in_index=-1,
      feature_keys=['stage1', 'stage2', 'stage3', 'stage4'])


def _Parseq() -> dict[str, Any]:
  """keras_hub's parseq_backbone_test.py, a 16 x 32 image and width 16."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  return dict(
      image_encoder=keras_hub.models.ViTBackbone(
          image_shape=(16, 32, 3), patch_size=(4, 8), num_layers=2,
          num_heads=2, hidden_dim=16, mlp_dim=32, use_class_token=False,
          name='image_encoder'),
      max_label_length=SEQ - 1, decoder_hidden_dim=16, num_decoder_layers=1,
      num_decoder_heads=2, decoder_mlp_dim=32)


def _DFine() -> dict[str, Any]:
  """keras_hub's d_fine_backbone_test.py (no denoising queries: they need
  labels)."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  backbone = keras_hub.models.HGNetV2Backbone(
      stem_channels=[3, 8, 8],
      stackwise_stage_filters=[[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
      apply_downsample=[False, True], use_lightweight_conv_block=[False, False],
      depths=[1, 1], hidden_sizes=[16, 32], embedding_size=8,
      use_learnable_affine_block=True, hidden_act='relu',
      image_shape=(32, 32, 3), out_features=['stage1', 'stage2'])
  return dict(
      backbone=backbone, decoder_in_channels=[16, 16], encoder_hidden_dim=16,
      num_denoising=0, num_labels=4, hidden_dim=16, learn_initial_query=False,
      num_queries=10, anchor_image_size=(32, 32), feat_strides=[4, 8],
      num_feature_levels=2, encoder_in_channels=[16, 32],
      encode_proj_layers=[1], num_attention_heads=2, encoder_ffn_dim=32,
      num_encoder_layers=1, hidden_expansion=0.5, depth_multiplier=0.5,
      eval_idx=-1, num_decoder_layers=3, decoder_attention_heads=2,
      decoder_ffn_dim=32, decoder_n_points=[2, 2], lqe_hidden_dim=16,
      num_lqe_layers=2, out_features=['stage1', 'stage2'],
      image_shape=(32, 32, 3), seed=0)


def _StableDiffusion3() -> dict[str, Any]:
  """keras_hub's stable_diffusion_3_backbone_test.py sub-models in float32:
  its VAE (32 channels: the group norms take 32 groups) and two CLIP text
  encoders of width 8 (vocabulary 50)."""
  from keras_hub.src.models.clip import clip_text_encoder  # pylint: disable=g-import-not-at-top
  from keras_hub.src.models.vae import vae_backbone  # pylint: disable=g-import-not-at-top
  clip = clip_text_encoder.CLIPTextEncoder
  return dict(
      vae=vae_backbone.VAEBackbone([32] * 4, [1] * 4, [32] * 4, [1] * 4,
                                   sampler_method='mode', name='vae'),
      clip_l=clip(50, 8, 8, 2, 2, 16, 'quick_gelu', -2, name='clip_l'),
      clip_g=clip(50, 8, 8, 2, 2, 16, 'gelu', -2, name='clip_g'))


# Sub-model arguments, made afresh for every build (keras_hub's own backbone
# tests build their composite backbones so, from small sub-models).
_PARTS = {
    'CLIPBackbone': lambda: _Encoders('CLIP'),
    'SigLIPBackbone': lambda: _Encoders('SigLIP'),
    'MetaCLIP2Backbone': lambda: _Encoders('MetaCLIP2'),
    'SegFormerBackbone': lambda: dict(image_encoder=_MiT()),
    'DeepLabV3Backbone': lambda: dict(image_encoder=_ResNet(3)),
    'BASNetBackbone': lambda: dict(image_encoder=_ResNet(4, 64)),
    'RetinaNetBackbone': lambda: dict(image_encoder=_ResNet(4)),
    'SAMBackbone': _Sam,
    'SAM3PromptableConceptBackbone': _Sam3,
    'BLIP2Backbone': _Blip2,
    'DepthAnythingBackbone': _DepthAnything,
    'PARSeqBackbone': _Parseq,
    'DFineBackbone': _DFine,
    'StableDiffusion3Backbone': _StableDiffusion3,
}


# Classes the zoo does not build, and why (what a tiny config would need).
_NOT_BUILT = {
    'BASNetBackbone': (
        'its smallest build holds 50.6M parameters (its prediction and '
        'refinement heads are 64 filters wide and need a ResNet of 64 '
        'filters at every stage), too large for the zoo; a pipeline would '
        'take it as it takes ResNetBackbone'),
}


class NotBuiltError(ValueError):
  """The zoo has no tiny config for a keras_hub class (or Keras cannot build
  it from one)."""


def Names() -> list[str]:
  """Every backbone class keras_hub exports (but its two base classes),
  then the task models."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  names = sorted(n for n in dir(keras_hub.models)
                 if n.endswith('Backbone') and n not in _ABSTRACT and
                 inspect.isclass(getattr(keras_hub.models, n)))
  return names + list(TASKS)


def _IsRandomness(name: str, value: Any) -> bool:
  return ('dropout' in name and isinstance(value, (int, float)) and
          not isinstance(value, bool))


def _Backbone(name: str, randomness: bool) -> Any:
  import keras_hub  # pylint: disable=g-import-not-at-top
  if name in _NOT_BUILT:
    raise NotBuiltError(f'not built: {_NOT_BUILT[name]}')
  cls = getattr(keras_hub.models, name)
  params = inspect.signature(cls.__init__).parameters
  config = {k: v for k, v in _POOL.items() if k in params}
  config.update({k: v for k, v in _OWN.get(name, {}).items() if k in params})
  if name in _PARTS:
    config.update(_PARTS[name]())
  missing = [k for k, p in params.items()
             if k not in ('self', 'args', 'kwargs') and
             p.default is p.empty and k not in config]
  if missing:
    raise NotBuiltError(f'no tiny config for its required arguments {missing}')
  if not randomness:
    for k, p in params.items():
      value = config.get(k, p.default)
      if _IsRandomness(k, value):
        config[k] = 0.0
  try:
    return cls(**config)
  except Exception as e:  # pylint: disable=broad-except
    raise NotBuiltError(f'Keras cannot build it from the tiny config '
                        f'{sorted(config)}: {type(e).__name__}: '
                        f'{str(e).splitlines()[0][:200]}') from e


def Build(name: str, randomness: bool = False) -> Any:
  """keras_hub model `name` (a backbone class or a TASKS key), tiny.

  Args:
    name: one of Names().
    randomness: keep the class's default dropout; False: every dropout 0.

  Raises:
    NotBuiltError: no tiny config, or Keras cannot build from it.
  """
  import keras_hub  # pylint: disable=g-import-not-at-top
  if name not in TASKS:
    return _Backbone(name, randomness)
  backbone_name, extra = TASKS[name]
  backbone = _Backbone(backbone_name, randomness)
  cls = getattr(keras_hub.models, name)
  params = inspect.signature(cls.__init__).parameters
  extra = dict(extra, preprocessor=None)
  if 'dropout' in params and not randomness:
    extra['dropout'] = 0.0
  return cls(backbone=backbone, **extra)


def HasRandomness(model: Any) -> bool:
  """Whether `model` draws random numbers in training: a Dropout of rate >
  0, or a layer holding a seed generator whose dropout-like attribute is
  positive."""
  import keras  # pylint: disable=g-import-not-at-top
  for layer in model._flatten_layers():  # pylint: disable=protected-access
    if isinstance(layer, keras.layers.Dropout) and layer.rate > 0:
      return True
    if getattr(layer, '_seed_generators', None):
      if any(_IsRandomness(k, v) and v > 0 for k, v in vars(layer).items()):
        return True
  return False

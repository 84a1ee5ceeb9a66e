"""OpenAI's enumerations, defined once: each a ``Literal`` type and its values.

The values are in the order OpenAI lists them in its errors. The request
schema, the OpenAPI document, the stream encoder and the upstream repair all
read them from here.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["system", "assistant", "user", "function", "tool", "developer"]
ROLES: tuple[Role, ...] = get_args(Role)

ContentPartType = Literal["text", "image_url", "input_audio", "refusal", "audio", "file"]
CONTENT_PART_TYPES: tuple[ContentPartType, ...] = get_args(ContentPartType)
"""Every part type OpenAI knows, in any message; only text parts (and an assistant's
refusal parts) are served."""

Modality = Literal["text", "audio"]
MODALITIES: tuple[Modality, ...] = get_args(Modality)

AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm16"]
AUDIO_FORMATS: tuple[AudioFormat, ...] = get_args(AudioFormat)

ResponseFormatType = Literal["text", "json_object", "json_schema"]
RESPONSE_FORMAT_TYPES: tuple[ResponseFormatType, ...] = get_args(ResponseFormatType)

ToolType = Literal["function"]
TOOL_TYPES: tuple[ToolType, ...] = get_args(ToolType)

ToolChoiceMode = Literal["none", "auto", "required"]
TOOL_CHOICE_MODES: tuple[ToolChoiceMode, ...] = get_args(ToolChoiceMode)
"""The string forms of ``tool_choice``; an object names one function instead."""

FunctionCallMode = Literal["none", "auto"]
FUNCTION_CALL_MODES: tuple[FunctionCallMode, ...] = get_args(FunctionCallMode)
"""The string forms of the deprecated ``function_call``, as OpenAI names them."""

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
REASONING_EFFORTS: tuple[ReasoningEffort, ...] = get_args(ReasoningEffort)

ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
SERVICE_TIERS: tuple[ServiceTier, ...] = get_args(ServiceTier)

Verbosity = Literal["low", "medium", "high"]
VERBOSITIES: tuple[Verbosity, ...] = get_args(Verbosity)

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
"""Why a choice ended; ``function_call`` answers the deprecated ``functions``."""

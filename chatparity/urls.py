"""Mount with ``path("", include("chatparity.urls"))`` to serve ``/v1/...``."""

from django.urls import path, re_path

from .transport import health, views

app_name = "chatparity"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/responses", views.create_response, name="responses"),
    path("v1/responses/<str:response_id>", views.response, name="response"),
    path(
        "v1/responses/<str:response_id>/input_items",
        views.response_input_items,
        name="response-input-items",
    ),
    path("v1/messages", views.create_message, name="messages"),
    path("v1/messages/count_tokens", views.count_message_tokens, name="messages-count-tokens"),
    # Anthropic's clients get Anthropic's 404 under /v1/messages/.
    re_path(r"^v1/messages/", views.messages_not_found, name="messages-not-found"),
    path("v1/embeddings", views.create_embeddings, name="embeddings"),
    path("v1/models", views.list_models, name="models"),
    path("v1/models/<path:model>", views.retrieve_model, name="model"),
    path("v1/openapi.json", views.openapi, name="openapi"),
    path("healthz", health.healthz, name="health"),
    # Anything else under /v1/ is OpenAI's 404 in the envelope, not an HTML page.
    re_path(r"^v1/", views.invalid_url, name="invalid-url"),
]

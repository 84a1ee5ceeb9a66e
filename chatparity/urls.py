"""Mount with ``path("", include("chatparity.urls"))`` to serve ``/v1/...``."""

from django.urls import path

from . import views

app_name = "chatparity"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/models", views.list_models, name="models"),
    path("v1/models/<path:model>", views.retrieve_model, name="model"),
]

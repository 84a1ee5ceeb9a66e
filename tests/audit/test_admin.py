"""The audit trail in the admin: read by staff holding its view permission, and neither
added to, changed nor deleted by anyone, superusers included."""

from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.test import Client, TestCase

from chatparity.audit.models import AuditEntry
from chatparity.models import Plan

CHANGELIST = "/admin/chatparity_audit/auditentry/"


class AuditAdminTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.plan = Plan.objects.create(name="starter", owner_token_budget=100)
        cls.entry = AuditEntry.objects.get()
        cls.superuser = User.objects.create_superuser("root")
        cls.auditor = User.objects.create_user("auditor", is_staff=True)
        cls.auditor.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
        cls.staff = User.objects.create_user("staff", is_staff=True)

    def detail(self):
        return f"{CHANGELIST}{self.entry.pk}/change/"

    def test_staff_with_the_view_permission_read_the_list_and_an_entry(self):
        self.client.force_login(self.auditor)
        listing = self.client.get(CHANGELIST)
        assert listing.status_code == 200
        assert "starter" in listing.content.decode()
        page = self.client.get(self.detail())
        assert page.status_code == 200
        html = page.content.decode()
        assert "<th>owner_token_budget</th><td>—</td><td>100</td>" in html
        assert 'name="_save"' not in html

    def test_staff_without_it_see_nothing(self):
        self.client.force_login(self.staff)
        assert self.client.get(CHANGELIST).status_code == 403
        assert self.client.get(self.detail()).status_code == 403

    def test_nobody_adds_changes_or_deletes_an_entry(self):
        for user in (self.auditor, self.superuser):
            self.client.force_login(user)
            assert self.client.get(f"{CHANGELIST}add/").status_code == 403
            assert self.client.post(self.detail(), {"object_repr": "forged"}).status_code == 403
            assert self.client.get(f"{CHANGELIST}{self.entry.pk}/delete/").status_code == 403
            bulk = {"action": "delete_selected", "_selected_action": [self.entry.pk], "post": "yes"}
            self.client.post(CHANGELIST, bulk)
            assert "delete_selected" not in self.client.get(CHANGELIST).content.decode()
        self.entry.refresh_from_db()
        assert self.entry.object_repr == "starter"

    def test_no_permission_to_add_change_or_delete_exists(self):
        codenames = set(
            Permission.objects.filter(content_type__app_label="chatparity_audit").values_list(
                "codename", flat=True
            )
        )
        assert codenames == {"view_auditentry"}


def test_the_middleware_is_required(settings):
    settings.MIDDLEWARE = [
        name for name in settings.MIDDLEWARE if not name.startswith("chatparity.audit")
    ]
    assert "chatparity_audit.E001" in {message.id for message in run_checks()}


def test_with_the_middleware_no_error():
    assert "chatparity_audit.E001" not in {message.id for message in run_checks()}


class AuditListTests(TestCase):
    def test_each_entry_says_when_who_from_where_and_what_changed(self):
        admin = User.objects.create_superuser("root")
        client = Client(REMOTE_ADDR="203.0.113.7")
        client.force_login(admin)
        client.post("/admin/chatparity/plan/add/", {
            "name": "pro <b>", "priority": "0", "all_aliases": "on", "budget_period": "month",
            "owner_budget_period": "month",
        })  # fmt: skip
        response = client.get(CHANGELIST)
        assert response.context["cl"].list_display == ["time", "who", "change"]
        html = response.content.decode()
        assert (
            '<td class="field-who">root<div class="chatparity-muted">admin · 203.0.113.7</div></td>'
            in html
        )
        assert '<td class="field-change">created plan: pro &lt;b&gt;</td>' in html

"""AWS credentials for Bedrock lanes without a static key: botocore's own resolver chain.

Order (botocore.credentials.create_credential_resolver, the same as boto3 and the AWS CLI):
environment variables (AWS_ACCESS_KEY_ID, …), assume-role and web identity from the shared config
file's `profile`, web identity from AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN (what EKS IRSA
sets), SSO, the shared credentials file, container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI
or _RELATIVE_URI, what ECS sets), then the EC2 instance metadata service. With `role_arn:` the
chain's credentials are only the source: busbar assumes the role through STS (session name
"busbar") and renews it. Endpoints are botocore's too, so `AWS_ENDPOINT_URL_STS` points STS at a
test server, and container credentials may be any loopback URL.

`fetch()` blocks (STS, container or IMDS calls): busbar.upstream.refresh runs it on a worker
thread ahead of expiry; the lane's SigV4Signer is swapped whole, so signing stays synchronous.
"""
from __future__ import annotations

import datetime

from busbar.upstream.sigv4 import SigV4Signer

# botocore refreshes temporary credentials when 15 min remain (advisory) and blocks callers at
# 10 min (mandatory); refreshing at 15 min keeps us on botocore's non-blocking side.
REFRESH_MARGIN = 900.0
ROLE_SESSION_NAME = "busbar"


class NoCredentialsError(RuntimeError):
    """No source in the chain had credentials (message safe to log)."""


class AwsCredentialSource:
    """One Bedrock provider's credentials. `fetch()` → (SigV4Signer, expires_at epoch or None)."""

    kind = "aws"
    refresh_margin = REFRESH_MARGIN

    def __init__(self, region: str, profile: str | None = None, role_arn: str | None = None,
                 service: str = "bedrock"):
        self.region = region
        self.profile = profile
        self.role_arn = role_arn
        self.service = service
        self._creds = None      # botocore Credentials / RefreshableCredentials, made on first fetch

    def __repr__(self) -> str:
        return "AwsCredentialSource(region=%r, profile=%r, role_arn=%r)" % (
            self.region, self.profile, self.role_arn)

    def _resolve(self):
        import botocore.session
        from botocore.credentials import AssumeRoleCredentialFetcher, DeferredRefreshableCredentials
        session = botocore.session.Session(profile=self.profile)
        # STS calls go to the provider's region (regional STS endpoints), not the global one.
        session.set_config_variable("region", self.region)
        creds = session.get_credentials()
        if creds is None:
            raise NoCredentialsError(
                "no AWS credentials found (environment, profile %r, web identity, container, "
                "instance metadata)" % (self.profile or "default"))
        if self.role_arn:
            fetcher = AssumeRoleCredentialFetcher(
                client_creator=session.create_client, source_credentials=creds,
                role_arn=self.role_arn, extra_args={"RoleSessionName": ROLE_SESSION_NAME})
            creds = DeferredRefreshableCredentials(
                refresh_using=fetcher.fetch_credentials, method="assume-role")
        return creds

    def fetch(self):
        if self._creds is None:
            self._creds = self._resolve()
        creds = self._creds
        try:
            frozen = creds.get_frozen_credentials()
        except Exception as exc:
            # Keep no half-built state: the next try resolves the chain again.
            self._creds = None
            raise NoCredentialsError("AWS credentials could not be obtained: %s" % (
                exc.__class__.__name__,)) from None
        if not frozen.access_key or not frozen.secret_key:
            self._creds = None
            raise NoCredentialsError("the AWS credential chain returned an empty key")
        signer = SigV4Signer(frozen.access_key, frozen.secret_key, frozen.token, self.region,
                             self.service)
        return signer, _expiry(creds)


def _expiry(creds):
    """When temporary credentials expire (epoch seconds), None for long-term keys.
    RefreshableCredentials keeps it in `_expiry_time` (botocore has no public accessor)."""
    when = getattr(creds, "_expiry_time", None)
    if when is None:
        return None
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return when.timestamp()
    return None

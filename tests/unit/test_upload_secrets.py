"""What the Azure ML code upload takes for a secret (toolkit.azure.code_upload): a file's name, any case and any copy's
suffix, and its content, whatever its name; and what it must not take for one: ordinary project files, and code or
docs that only talk about secrets. The values below are built at run time, so this file itself is no secret."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from toolkit.azure import code_upload
from toolkit.azure.code_upload import secret_in_content, secret_in_name

KEY_BODY = base64.b64encode(bytes(range(48))).decode()  # a line of a key's base64 body
STORAGE_KEY = base64.b64encode(bytes(range(64))).decode()
CLIENT_SECRET = "Xy8Q~" + "abcDEF123_" * 3 + "z.-"
SUBSCRIPTION = "12345678-aaaa-bbbb-cccc-1234567890ab"
BEGIN, END = "-----BEGIN ", "-----END "

SECRET_NAMES = {
    "key": "an endpoint key", "KEY": "an endpoint key",
    "deploy.pem": "a private key or certificate", "server.key.bak": "a private key or certificate",
    "client.pfx": "a certificate bundle with its private key",
    "client.P12": "a certificate bundle with its private key",
    "laptop.ppk": "a PuTTY private key",
    "id_rsa": "an SSH key", "ID_RSA": "an SSH key", "id_rsa.bak": "an SSH key", "id_ed25519_sk": "an SSH key",
    "id_ecdsa.pub": "an SSH key", "id_dsa~": "an SSH key",
    **dict.fromkeys([".env", ".ENV", ".env.local", "prod.env", ".envrc"],
                    "an environment file (often holds credentials)"),
    ".netrc": "a netrc file (logins and passwords)", "_netrc": "a netrc file (logins and passwords)",
    ".git-credentials": "git's credential store", ".pypirc": "a PyPI config (upload credentials)",
    ".pgpass": "a password file", "credentials": "a credentials file", "credentials.json": "a credentials file",
    "api_key.txt": "a file named for a secret", "ApiKey.json": "a file named for a secret",
    "openai-api-key": "a file named for a secret", "db-secret.yaml": "a file named for a secret",
    "client_secret_123.json": "a file named for a secret", "access_token.txt": "a file named for a secret",
}
ORDINARY_NAMES = ["keyboard.py", "monkey.py", "tokenizer.json", "tokenizer_config.json", "environment.yml",
                  "key_files.py", "test_endpoint_keys.py", "api_keys.py", "client_secrets.py", "credentials.py",
                  "secrets.md", "keys.ipynb", "monkey.key.md", "README.md", "config.json", "keys", "id.txt",
                  "envelope.txt", "venv.cfg", "deploy.pem.md"]


def _pem(kind: str) -> str:
    return f"{BEGIN}{kind}-----\n{KEY_BODY}\n{KEY_BODY}\n{END}{kind}-----\n"


SECRET_CONTENTS = {  # id: (text, what the file holds)
    "openssh key": (_pem("OPENSSH PRIVATE KEY"), "an OpenSSH private key"),
    "rsa key": (_pem("RSA PRIVATE KEY"), "a PEM private key"),
    "pkcs8 key": (_pem("PRIVATE KEY"), "a PEM private key"),
    "encrypted pem key": (f"{BEGIN}RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n", "a PEM private key"),
    "pgp key": (_pem("PGP PRIVATE KEY BLOCK"), "a PEM private key"),
    "key inside json": ('{"private_key": "' + f"{BEGIN}PRIVATE KEY-----\\n{KEY_BODY}\\n" + '"}', "a PEM private key"),
    "putty key": (f"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPublic-Lines: 2\n{KEY_BODY}\n",
                  "a PuTTY private key"),
    "storage connection string": (f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={STORAGE_KEY}",
                                  "an Azure connection string with its key"),
    "service bus connection string": (f"Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=root;"
                                      f"SharedAccessKey={STORAGE_KEY}", "an Azure connection string with its key"),
    "sas url": (f"https://a.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig={STORAGE_KEY[:43]}%3D",
                "an Azure shared access signature"),
    "client secret json": (f'{{"clientSecret": "{CLIENT_SECRET}"}}', "a client secret"),
    "client secret env": (f"export AZURE_CLIENT_SECRET={CLIENT_SECRET}\n", "a client secret"),
    "client secret python": (f"client_secret = '{CLIENT_SECRET}'\n", "a client secret"),
    "service principal": (f'{{"clientSecret": "{CLIENT_SECRET}",\n "subscriptionId": "{SUBSCRIPTION}"}}',
                          "a client secret beside an Azure subscription id"),
    "aws access key": ("aws_access_key_id = AKIA" + "Z7" * 8 + "\n", "an AWS access key"),
    "aws secret key": ("aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "z" * 10, "an AWS secret key"),
    "netrc one line": ("machine example.com login me password hunter22\n", "netrc logins (machine ... password)"),
    "netrc lines": ("machine example.com\n\tlogin me\n\tpassword hunter22\n", "netrc logins (machine ... password)"),
    "netrc default": ("default login me password hunter22\n", "netrc logins (machine ... password)"),
    "git credential store": (f"https://me:{CLIENT_SECRET}@github.com\n", "a URL with a password in it"),
    "pip index url": (f"--index-url https://me:{CLIENT_SECRET}@pkgs.example.com/simple\n",
                      "a URL with a password in it"),
    "github token": ("GH_TOKEN=ghp_" + "a1B2c3D4e5" * 4, "a GitHub token"),
    "pypi token": ("password = pypi-" + "AgEIcHlwaS5vcmc" * 5, "a PyPI token"),
    "slack token": ("SLACK=xoxb-" + "1234567890-abcdefghij", "a Slack token"),
}
ORDINARY_CONTENTS = {  # id: text that names a secret's marker without holding a secret
    "code reading a secret": "client_secret = os.environ['AZURE_CLIENT_SECRET']\n"
                             "credential = ClientSecretCredential(tenant, client, client_secret=client_secret)\n",
    "code passing a secret on": "    client_secret=args.client_secret,\n",
    "docs naming a key header": f"A key starts with `{BEGIN}OPENSSH PRIVATE KEY-----`; never commit one.\n",
    "docs with placeholders": "Set `AccountKey=<your key>`, or `clientSecret: ${{ secrets.SP }}` in CI.\n",
    "plain urls": "https://github.com/org/repo.git git@github.com:org/repo.git http://localhost:8080/a@b\n",
    "a short example password": "assert redact('https://me:secret@host:5000/x') == 'https://me:***@host:5000/x'\n",
    "prose": "machine learning needs a password manager\nthe default password is admin; each machine has one\n",
    "a subscription id alone": f'{{"subscriptionId": "{SUBSCRIPTION}", "resourceGroup": "rg"}}',
    "a public key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop\n",
}


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_known_in_any_case_and_with_a_copys_suffix(name):
    assert secret_in_name(name) == SECRET_NAMES[name]


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names_and_code_about_secrets_are_no_secret_by_name(name):
    assert secret_in_name(name) is None


@pytest.mark.parametrize("case", SECRET_CONTENTS)
def test_secret_contents_are_known_whatever_the_file_is_called(case):
    text, what = SECRET_CONTENTS[case]
    assert secret_in_content(text) == what
    assert secret_in_content("# notes\n" * 100 + text + "\n# more\n" * 100) == what, "anywhere in the head"


@pytest.mark.parametrize("case", ORDINARY_CONTENTS)
def test_text_that_names_a_secret_without_holding_one_is_no_secret(case):
    assert secret_in_content(ORDINARY_CONTENTS[case]) is None


def test_the_rules_and_their_tests_are_no_secret_themselves():
    """Both are uploaded with the project: each pattern needs a value after its marker."""
    for path in (Path(code_upload.__file__), Path(__file__)):
        assert secret_in_content(path.read_text()) is None, path

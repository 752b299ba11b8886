"""Prints infra/template.yaml as CloudFormation deploys it: translated by aws-sam-translator
(SAM's policy templates expanded into the roles' statements, the event sources, schedules and
Globals into plain resources). The functions' `CodeUri` (`..`, a local path that `sam build`
replaces) becomes an S3 URI as `sam package` writes it, since the translator accepts no other;
the managed-policy loader answers every name with its AWS ARN, and the region is fixed: no AWS
call is made.

With `--managed-policies ARN...` it prints those AWS managed policies' documents instead
(from the copy moto ships), by ARN.
"""
import json
import os
import sys

os.environ["AWS_DEFAULT_REGION"] = "us-east-1"

if sys.argv[1:2] == ["--managed-policies"]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    known = json.loads(aws_managed_policies_data)
    documents = {}
    for arn in sys.argv[2:]:
        name = arn.rsplit("/", 1)[-1]
        if name not in known:
            sys.exit(f"no AWS managed policy {name} in moto's copy")
        documents[arn] = known[name]["Document"]
    json.dump(documents, sys.stdout)
    sys.exit(0)

try:
    from samtranslator.translator.transform import transform
except ImportError:
    sys.exit("aws-sam-translator is not installed in HOOKLANE_TEST_PYTHON: "
             "pip install aws-sam-translator (tests/requirements.txt)")
from cfnlint.decode import decode

template, errors = decode("infra/template.yaml")
assert not errors, errors
template = json.loads(json.dumps(template))
for resource in template["Resources"].values():
    if resource["Type"] == "AWS::Serverless::Function":
        resource["Properties"]["CodeUri"] = "s3://bucket/bootstrap.zip"


class Policies:
    def get(self, name, default=None):
        return "arn:aws:iam::aws:policy/" + name


class Loader:
    def load(self):
        return Policies()


json.dump(transform(template, {}, Loader()), sys.stdout)

// Evaluates recorded AWS requests against IAM roles with iam-simulate (tests/e2e/iam.rs).
// stdin: {account, roles: {role: {principal, policies: [{name, document}]}},
//         requests: [{role, action, resource, context}]}
// stdout: one result per request, in order: {decision, errors, allowedBy: [{policy, statement,
// actions}]}, where `statement` is the statement's index in its policy and `actions` the
// action patterns of it that matched.
const path = require('node:path');

const modules = process.env.HOOKLANE_TEST_NODE_MODULES;
if (!modules) throw new Error('HOOKLANE_TEST_NODE_MODULES is not set (scripts/test-env-browser prints it)');
// Resolved as a package (its `exports`), from the directory that holds node_modules.
const { runSimulation } = require(
  require.resolve('@cloud-copilot/iam-simulate', { paths: [path.dirname(modules)] }),
);

async function main() {
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { account, roles, requests } = JSON.parse(input);
  // Statements are named by their index (Sid), which the result reports back.
  const policies = {};
  for (const [role, { policies: list }] of Object.entries(roles)) {
    policies[role] = list.map(({ name, document }) => ({
      name,
      policy: {
        ...document,
        Statement: [].concat(document.Statement).map((s, i) => ({ ...s, Sid: `s${i}` })),
      },
    }));
  }
  const results = [];
  for (const request of requests) {
    const role = roles[request.role];
    if (!role) {
      results.push({ decision: 'NoRole', errors: `no role ${request.role}`, allowedBy: [] });
      continue;
    }
    const response = await runSimulation(
      {
        identityPolicies: policies[request.role],
        serviceControlPolicies: [],
        resourceControlPolicies: [],
        request: {
          action: request.action,
          principal: role.principal,
          resource: { accountId: account, resource: request.resource },
          contextVariables: request.context || {},
        },
      },
      {},
    );
    if (response.resultType === 'error') {
      results.push({ decision: 'Invalid', errors: response.errors, allowedBy: [] });
      continue;
    }
    const analysis = response.resultType === 'single' ? response.result.analysis : undefined;
    const allowedBy = (analysis?.identityAnalysis?.allowStatements || []).map((s) => ({
      policy: s.policyId,
      statement: Number(String(s.explain.identifier).slice(1)),
      actions: [].concat(s.explain.actions || []).filter((a) => a.matches).map((a) => a.action),
    }));
    results.push({ decision: response.overallResult, errors: null, allowedBy });
  }
  process.stdout.write(JSON.stringify(results));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

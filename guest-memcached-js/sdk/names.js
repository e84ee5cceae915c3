// Child names derived from the parent's name: whether the API server will accept them. A
// custom resource's name may be any DNS subdomain (253 characters, dots allowed), but a
// Service name is a DNS-1035 label, a Pod hostname a DNS-1123 label, a label value at most 63
// characters. Check them before deciding anything and report a failure as an invalid spec.
// Rules from Kubernetes' apimachinery/pkg/util/validation; mirrors wit/sdk/src/names.rs.

const MAX_LABEL = 63;
const MAX_SUBDOMAIN = 253;
const dnsLabel = (v) => v.length > 0 && v.length <= MAX_LABEL && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(v);

export const NameRule = {
  dns1035Label: {
    accepts: (v) => dnsLabel(v) && /^[a-z]/.test(v),
    max: MAX_LABEL,
    describe: "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter)",
  },
  dns1123Label: {
    accepts: dnsLabel,
    max: MAX_LABEL,
    describe: "a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
  },
  dns1123Subdomain: {
    accepts: (v) => v.length <= MAX_SUBDOMAIN && v.split('.').every(dnsLabel),
    max: MAX_SUBDOMAIN,
    describe: 'a DNS-1123 subdomain (dot-separated DNS-1123 labels)',
  },
  labelValue: {
    accepts: (v) => v === '' || (v.length <= MAX_LABEL && /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/.test(v)),
    max: MAX_LABEL,
    describe: "a label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)",
  },
};

/** Names derived from `{name}`; for indexed children name the largest index the spec allows. */
export const ChildName = {
  service: (template) => ({ what: 'Service', template, rule: NameRule.dns1035Label }),
  dnsLabel: (what, template) => ({ what, template, rule: NameRule.dns1123Label }),
  object: (what, template) => ({ what, template, rule: NameRule.dns1123Subdomain }),
  labelValue: (key, template) => ({ what: `label ${key}`, template, rule: NameRule.labelValue }),
};

/**
 * Undefined when every derived name is valid for `parent`; otherwise a message naming the
 * first bad one and the longest parent name that would do.
 */
export function checkChildNames(parent, childNames) {
  for (const child of childNames) {
    const name = child.template.replaceAll('{name}', parent);
    if (child.rule.accepts(name)) continue;
    const longest = Math.min(...childNames.map((c) => c.rule.max - c.template.replaceAll('{name}', '').length));
    const fix =
      parent.length > longest
        ? `delete this resource and create it again with a name of at most ${longest} characters`
        : "delete this resource and create it again with a name of lower-case letters, digits and '-' only";
    return `metadata.name \`${parent}\` cannot be used: the ${child.what} name \`${name}\` derived from it (${name.length} characters) is not ${child.rule.describe} of at most ${child.rule.max} characters; ${fix}`;
  }
  return undefined;
}

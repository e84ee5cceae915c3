//! Child names derived from the parent's name: whether the API server will accept them.
//!
//! A custom resource's name may be any DNS subdomain (up to 253 characters, dots allowed),
//! but the names a plugin derives from it often have stricter rules: a Service name is a
//! DNS-1035 label (63 characters, starting with a letter, no dots), a Pod `hostname` a
//! DNS-1123 label, a label value at most 63 characters. A name that breaks them fails every
//! apply with an API error the user never sees in the resource's status. Check the names
//! once, before deciding anything, and report the failure as an invalid spec instead:
//!
//! ```
//! use policy_host_sdk::names::{ChildName, check_child_names};
//!
//! const CHILD_NAMES: &[ChildName] = &[
//!     ChildName::service("{name}-client"),
//!     ChildName::dns_label("Pod", "{name}-8"),
//!     ChildName::label_value("app.kubernetes.io/instance", "{name}"),
//! ];
//!
//! assert!(check_child_names("example", CHILD_NAMES).is_ok());
//! let long = "x".repeat(60);
//! let error = check_child_names(&long, CHILD_NAMES).expect_err("60 characters is too long");
//! assert_eq!(error.longest_valid_parent, Some(56));
//! ```
//!
//! Rules from Kubernetes' `apimachinery/pkg/util/validation` (`IsDNS1035Label`,
//! `IsDNS1123Label`, `IsDNS1123Subdomain`, `IsValidLabelValue`).

use std::fmt;

/// The placeholder a [`ChildName`] template uses for the parent's name.
pub const PARENT_PLACEHOLDER: &str = "{name}";

/// Longest DNS label (RFC 1123 and RFC 1035), and longest label value.
pub const MAX_LABEL_LENGTH: usize = 63;

/// Longest DNS subdomain (RFC 1123).
pub const MAX_SUBDOMAIN_LENGTH: usize = 253;

/// The rule the API server applies to a name or value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1035 label: at most 63 lower-case letters, digits and `-`, starting with a letter
    /// and ending with a letter or digit. Service names.
    Dns1035Label,
    /// DNS-1123 label: at most 63 lower-case letters, digits and `-`, starting and ending with
    /// a letter or digit. Pod `hostname`/`subdomain`, names that become DNS names.
    Dns1123Label,
    /// DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels. Most object
    /// names (Pods, PersistentVolumeClaims, ConfigMaps, ...).
    Dns1123Subdomain,
    /// Label value: empty, or at most 63 letters, digits, `-`, `_` and `.`, starting and
    /// ending with a letter or digit.
    LabelValue,
}

impl NameRule {
    /// Whether `value` follows the rule.
    pub fn accepts(self, value: &str) -> bool {
        match self {
            NameRule::Dns1035Label => {
                is_dns_label(value) && value.starts_with(|c: char| c.is_ascii_lowercase())
            }
            NameRule::Dns1123Label => is_dns_label(value),
            NameRule::Dns1123Subdomain => {
                value.len() <= MAX_SUBDOMAIN_LENGTH && value.split('.').all(is_dns_label)
            }
            NameRule::LabelValue => {
                value.is_empty()
                    || (value.len() <= MAX_LABEL_LENGTH
                        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                        && value
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            }
        }
    }

    /// The longest value the rule allows.
    pub fn max_length(self) -> usize {
        match self {
            NameRule::Dns1123Subdomain => MAX_SUBDOMAIN_LENGTH,
            _ => MAX_LABEL_LENGTH,
        }
    }

    /// What the rule is called in Kubernetes' messages.
    pub fn describe(self) -> &'static str {
        match self {
            NameRule::Dns1035Label => {
                "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter)"
            }
            NameRule::Dns1123Label => {
                "a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
            }
            NameRule::Dns1123Subdomain => "a DNS-1123 subdomain (dot-separated DNS-1123 labels)",
            NameRule::LabelValue => {
                "a label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
            }
        }
    }
}

fn is_dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_LABEL_LENGTH
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

/// A name (or label value) a plugin derives from its parent's name: `template` with
/// [`PARENT_PLACEHOLDER`] where the parent's name goes, e.g. `"{name}-client"`. For indexed
/// children, name the largest index the spec allows (`"{name}-8"` for up to 9 members), the
/// longest such name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildName {
    /// What carries the name, for the message: `Service`, `Pod`, `label app.kubernetes.io/instance`.
    pub what: &'static str,
    /// The name with `{name}` in place of the parent's name.
    pub template: &'static str,
    /// The rule the API server applies to it.
    pub rule: NameRule,
}

impl ChildName {
    /// A Service's name (DNS-1035 label).
    pub const fn service(template: &'static str) -> Self {
        ChildName {
            what: "Service",
            template,
            rule: NameRule::Dns1035Label,
        }
    }

    /// A name that must be a DNS-1123 label, e.g. a Pod whose name is also its `hostname`.
    pub const fn dns_label(what: &'static str, template: &'static str) -> Self {
        ChildName {
            what,
            template,
            rule: NameRule::Dns1123Label,
        }
    }

    /// An object name that must be a DNS-1123 subdomain (most kinds).
    pub const fn object(what: &'static str, template: &'static str) -> Self {
        ChildName {
            what,
            template,
            rule: NameRule::Dns1123Subdomain,
        }
    }

    /// The value of label `key`.
    pub const fn label_value(key: &'static str, template: &'static str) -> Self {
        ChildName {
            what: key,
            template,
            rule: NameRule::LabelValue,
        }
    }

    /// The name for this parent.
    pub fn for_parent(&self, parent: &str) -> String {
        self.template.replace(PARENT_PLACEHOLDER, parent)
    }

    /// Characters the template adds to the parent's name.
    fn added_length(&self) -> usize {
        self.for_parent("").len()
    }
}

/// A child name the API server would refuse, from [`check_child_names`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildNameError {
    /// The parent's name.
    pub parent: String,
    /// What carries the refused name (`Service`, `Pod`, a label key).
    pub what: &'static str,
    /// The refused name.
    pub name: String,
    /// The rule it breaks.
    pub rule: NameRule,
    /// The longest parent name every checked child allows, if the parent is too long (rather
    /// than made of characters the rule refuses).
    pub longest_valid_parent: Option<usize>,
}

impl fmt::Display for ChildNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "metadata.name `{}` cannot be used: the {} name `{}` derived from it ({} characters) is not {} of at most {} characters; ",
            self.parent,
            self.what,
            self.name,
            self.name.len(),
            self.rule.describe(),
            self.rule.max_length(),
        )?;
        match self.longest_valid_parent {
            Some(max) => write!(
                f,
                "delete this resource and create it again with a name of at most {max} characters"
            ),
            None => write!(
                f,
                "delete this resource and create it again with a name of lower-case letters, digits and '-' only"
            ),
        }
    }
}

impl std::error::Error for ChildNameError {}

/// Checks every name in `children` for the parent named `parent`; the first one the API server
/// would refuse is the error, which says what to rename the parent to. Run it before any
/// other decision: a name cannot be fixed by editing the spec, only by recreating the parent.
pub fn check_child_names(parent: &str, children: &[ChildName]) -> Result<(), ChildNameError> {
    for child in children {
        let name = child.for_parent(parent);
        if child.rule.accepts(&name) {
            continue;
        }
        let longest_valid_parent = children
            .iter()
            .map(|c| c.rule.max_length().saturating_sub(c.added_length()))
            .min()
            .filter(|max| parent.len() > *max);
        return Err(ChildNameError {
            parent: parent.to_owned(),
            what: child.what,
            name,
            rule: child.rule,
            longest_valid_parent,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETCD_LIKE: &[ChildName] = &[
        ChildName::service("{name}"),
        ChildName::service("{name}-client"),
        ChildName::dns_label("Pod", "{name}-8"),
        ChildName::object("PersistentVolumeClaim", "data-{name}-8"),
        ChildName::label_value("app.kubernetes.io/instance", "{name}"),
    ];

    #[test]
    fn names_within_every_rule_pass() {
        for parent in ["a", "example-etcd-cluster", &"x".repeat(56)] {
            assert_eq!(check_child_names(parent, ETCD_LIKE), Ok(()), "{parent}");
        }
    }

    #[test]
    fn a_parent_too_long_for_its_longest_child_is_refused_with_the_length_to_use() {
        let parent = "x".repeat(57);
        let error = check_child_names(&parent, ETCD_LIKE).expect_err("57 characters is too long");
        assert_eq!(error.what, "Service");
        assert_eq!(error.name, format!("{parent}-client"));
        assert_eq!(error.longest_valid_parent, Some(56));
        let message = error.to_string();
        assert!(message.contains("64 characters"), "{message}");
        assert!(message.contains("at most 56 characters"), "{message}");
    }

    #[test]
    fn a_dotted_parent_is_refused_as_a_service_name_without_a_length_hint() {
        let error =
            check_child_names("my.cluster", ETCD_LIKE).expect_err("a dot is no Service name");
        assert_eq!(error.name, "my.cluster");
        assert_eq!(error.rule, NameRule::Dns1035Label);
        assert_eq!(error.longest_valid_parent, None);
    }

    #[test]
    fn each_rule_accepts_and_refuses_what_kubernetes_does() {
        let rows: &[(NameRule, &str, bool)] = &[
            (NameRule::Dns1035Label, "a-1", true),
            (NameRule::Dns1035Label, "1-a", false),
            (NameRule::Dns1035Label, "a-", false),
            (NameRule::Dns1123Label, "1-a", true),
            (NameRule::Dns1123Label, "-a", false),
            (NameRule::Dns1123Label, "A", false),
            (NameRule::Dns1123Label, &"a".repeat(63), true),
            (NameRule::Dns1123Label, &"a".repeat(64), false),
            (NameRule::Dns1123Subdomain, "a.b-c", true),
            (NameRule::Dns1123Subdomain, "a..b", false),
            (NameRule::Dns1123Subdomain, &"a".repeat(64), false),
            (NameRule::LabelValue, "", true),
            (NameRule::LabelValue, "A_b.c", true),
            (NameRule::LabelValue, "_a", false),
            (NameRule::LabelValue, &"a".repeat(64), false),
        ];
        for (rule, value, accepted) in rows {
            assert_eq!(rule.accepts(value), *accepted, "{rule:?} {value}");
        }
    }
}

package e2b

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/secret"
	"github.com/bothy/bothy/supervisor"
)

// E2B's secrets (the SDKs' Secret.create, update, getInfo, list, destroy) are bothyd's
// (package secret, docs/secrets.md), and a sandbox's network.rules header transforms that
// name one with ${e2b.secrets.NAME} (Secret.fill) are bindings of its policy: the egress
// proxy sets the header, with the value, on requests to the rule's host.
//
// What differs: a secret's id is "sec_" and its name; a name is lower-cased, as E2B stores it,
// and must then be a bothyd name (a letter, then letters, digits or underscores); metadata is
// not kept, so a request that carries some is refused rather than have it lost; versions are
// counted, but only the current value is kept. A transform header must carry exactly one
// ${e2b.secrets.NAME} (a literal header would have to be sent by bothyd as given, which its
// bindings do not do; a workload identity token has no issuer here), and a secret is set by one
// header, the same for every host it goes to.

// Secrets is what the E2B API needs of bothyd's secrets ([secret.Manager]).
type Secrets interface {
	Create(name, value string) (*secret.Secret, error)
	Rotate(name, value string) (*secret.Secret, error)
	Get(name string) (*secret.Secret, error)
	List() []secret.Secret
	Delete(name string) error
}

var _ Secrets = (*secret.Manager)(nil)

// secretIDPrefix starts E2B's secret ids, which the SDKs take wherever a name goes.
const secretIDPrefix = "sec_"

// secretBody is E2B's Secret: metadata only, never a value.
type secretBody struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int               `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

func secretOf(s *secret.Secret) secretBody {
	updated := s.CreatedAt
	if s.RotatedAt != nil {
		updated = *s.RotatedAt
	}
	return secretBody{SecretID: secretIDPrefix + s.Name, Name: s.Name, CurrentVersion: s.Version,
		Metadata: map[string]string{}, CreatedAt: s.CreatedAt, UpdatedAt: updated}
}

// secretWrite is E2B's NewSecret and SecretUpdate.
type secretWrite struct {
	Name     string            `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

func (h *Handler) secrets(w http.ResponseWriter) (Secrets, bool) {
	if h.cfg.Secrets == nil {
		writeError(w, http.StatusNotImplemented, "This server keeps no secrets.")
		return nil, false
	}
	return h.cfg.Secrets, true
}

// readSecretWrite decodes a create or update, refusing what bothyd would not keep. A decoding
// error is described without the body, which holds the value.
func readSecretWrite(w http.ResponseWriter, r *http.Request) (secretWrite, bool) {
	var b secretWrite
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, "The body is not a JSON object with name and value; send one.")
		return b, false
	}
	if b.Value == nil {
		writeError(w, http.StatusBadRequest, "The body has no value; send the secret's value.")
		return b, false
	}
	if len(b.Metadata) > 0 {
		writeError(w, http.StatusBadRequest, "bothyd keeps no metadata of a secret; leave metadata out.")
		return b, false
	}
	return b, true
}

// secretName is bothyd's name of an E2B secret id or name.
func secretName(idOrName string) string {
	return strings.ToLower(strings.TrimPrefix(idOrName, secretIDPrefix))
}

func (h *Handler) createSecret(w http.ResponseWriter, r *http.Request) {
	store, ok := h.secrets(w)
	if !ok {
		return
	}
	b, ok := readSecretWrite(w, r)
	if !ok {
		return
	}
	s, err := store.Create(strings.ToLower(b.Name), *b.Value)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretOf(s))
}

func (h *Handler) updateSecret(w http.ResponseWriter, r *http.Request) {
	store, ok := h.secrets(w)
	if !ok {
		return
	}
	b, ok := readSecretWrite(w, r)
	if !ok {
		return
	}
	s, err := store.Rotate(secretName(r.PathValue("id")), *b.Value)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(s))
}

func (h *Handler) getSecret(w http.ResponseWriter, r *http.Request) {
	store, ok := h.secrets(w)
	if !ok {
		return
	}
	s, err := store.Get(secretName(r.PathValue("id")))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(s))
}

// listSecrets answers every secret on one page (there are at most 256).
func (h *Handler) listSecrets(w http.ResponseWriter, r *http.Request) {
	store, ok := h.secrets(w)
	if !ok {
		return
	}
	list := store.List()
	out := make([]secretBody, 0, len(list))
	for i := range list {
		out = append(out, secretOf(&list[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteSecret(w http.ResponseWriter, r *http.Request) {
	store, ok := h.secrets(w)
	if !ok {
		return
	}
	if err := store.Delete(secretName(r.PathValue("id"))); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// networkRule is E2B's SandboxNetworkRule.
type networkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// secretRef is E2B's reference to a secret in a transform (Secret.fill).
var secretRef = regexp.MustCompile(`\$\{e2b\.secrets\.([^}]*)\}`)

// bindingsOf maps E2B's per-host header transforms onto bothyd's secret bindings.
func bindingsOf(rules map[string][]networkRule) ([]supervisor.SecretBinding, error) {
	type key struct{ secret, header, template string }
	hosts := map[key][]string{}
	var order []key
	for _, host := range slices.Sorted(maps.Keys(rules)) {
		for i, rule := range rules[host] {
			if rule.Transform == nil {
				continue
			}
			for _, name := range slices.Sorted(maps.Keys(rule.Transform.Headers)) {
				v := rule.Transform.Headers[name]
				field := fmt.Sprintf("network.rules[%q][%d].transform.headers[%q]", host, i, name)
				refs := secretRef.FindAllStringSubmatchIndex(v, -1)
				if len(refs) != 1 {
					return nil, errcode.Invalid(field, "%s carries %d references to a secret; bothyd sets a header that carries exactly one, as ${e2b.secrets.NAME} (Secret.fill), and sends no literal header.", field, len(refs))
				}
				ref := refs[0]
				k := key{secret: strings.ToLower(v[ref[2]:ref[3]]), header: name, template: v[:ref[0]] + "{value}" + v[ref[1]:]}
				if _, seen := hosts[k]; !seen {
					order = append(order, k)
				}
				hosts[k] = append(hosts[k], strings.ToLower(host))
			}
		}
	}
	var out []supervisor.SecretBinding
	seen := map[string]bool{}
	for _, k := range order {
		if seen[k.secret] {
			return nil, errcode.Invalid("network.rules", "The secret %q is set by more than one header or template; bothyd binds a secret with one header, the same for every host it goes to.", k.secret)
		}
		seen[k.secret] = true
		out = append(out, supervisor.SecretBinding{Secret: k.secret, Hosts: hosts[k],
			Header: &supervisor.SecretHeader{Name: k.header, Value: k.template}})
	}
	return out, nil
}

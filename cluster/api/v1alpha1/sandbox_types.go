package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxState is a sandbox's state as its node reads it (the API's SandboxState), or
// node-lost, which no node writes: it is how the cluster reads a sandbox whose node's lease
// has lapsed.
// +kubebuilder:validation:Enum=provisioned;starting;running;paused;stopping;stopped;node-lost
type SandboxState string

// The states a Sandbox's status reads.
const (
	StateProvisioned SandboxState = "provisioned"
	StateStarting    SandboxState = "starting"
	StateRunning     SandboxState = "running"
	StatePaused      SandboxState = "paused"
	StateStopping    SandboxState = "stopping"
	StateStopped     SandboxState = "stopped"
	StateNodeLost    SandboxState = "node-lost"
)

// NodeLabel is the label that names the node holding a Sandbox, so that a node lists its own
// objects, and an operator a node's sandboxes, with a label selector.
const NodeLabel = "cluster.bothy.dev/node"

// PlacedAnnotation is written by the controller with NodeLabel when it places a Sandbox
// object a user made (kubectl apply), names the node asked to create the sandbox. A node creates a
// sandbox for an object only when this annotation names it and the object's status names no
// node yet: an object a node made from its own sandbox never carries it, so a sandbox
// deleted through the REST API is never made again from its object (docs/cluster.md).
const PlacedAnnotation = "cluster.bothy.dev/placed"

// Finalizer holds a Sandbox object until its node has deleted the sandbox, so that
// `kubectl delete` is a delete of the sandbox and the object never vanishes before it. The
// node that holds the sandbox adds it and removes it; the controller adds it when it places.
const Finalizer = "cluster.bothy.dev/sandbox"

// Resources are a sandbox's limits, as in the create request.
type Resources struct {
	// VCPUs is how many CPUs the sandbox may use.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VCPUs int32 `json:"vcpus,omitempty"`
	// MemoryMB is the sandbox's memory limit in MiB.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MemoryMB int32 `json:"memoryMB,omitempty"`
	// Pids bounds the sandbox's processes.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Pids int32 `json:"pids,omitempty"`
	// DiskMB is the size of the sandbox's own disk in MiB; 0: none.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DiskMB int32 `json:"diskMB,omitempty"`
}

// TemplateRef names the template generation a sandbox is cloned from.
type TemplateRef struct {
	// +kubebuilder:validation:MaxLength=128
	Template string `json:"template"`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Generation string `json:"generation,omitempty"`
}

// SandboxSpec is what the sandbox is: the create request's essentials. The environment is
// left out on purpose: it may hold credentials, and a Sandbox is readable by whoever may list
// the cluster's sandboxes.
type SandboxSpec struct {
	// Image is the image the sandbox runs ("host": the host's /usr, read-only).
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Image string `json:"image,omitempty"`
	// Template is set for a clone of a template generation.
	// +optional
	Template *TemplateRef `json:"template,omitempty"`
	// Runtime is the runtime kind (namespace, microvm); empty: the node's default.
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Runtime string `json:"runtime,omitempty"`
	// Resources are the sandbox's limits.
	// +optional
	Resources Resources `json:"resources,omitempty"`
	// Internet says the sandbox's egress policy lets it reach the internet.
	// +optional
	Internet bool `json:"internet,omitempty"`
	// Labels are the sandbox's own labels, as the API reports them.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// NodeName asks for a node; empty lets placement choose one.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// SandboxStatus is the node's view of the sandbox.
type SandboxStatus struct {
	// Node is the BothyNode that holds the sandbox.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Node string `json:"node,omitempty"`
	// State is the sandbox's state as its node last reported it, or node-lost.
	// +optional
	State SandboxState `json:"state,omitempty"`
	// Asleep says a paused sandbox was put to sleep because it was idle.
	// +optional
	Asleep bool `json:"asleep,omitempty"`
	// StartedAt is when the current or last launch started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// ExpiresAt is when the sandbox's lifetime ends.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`
	// ExitCode is how the last run ended, if one did.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// Message says why the node could not create the sandbox the object asks for, when it
	// could not; empty otherwise.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedAt is when the node last wrote this status.
	// +optional
	ObservedAt *metav1.Time `json:"observedAt,omitempty"`
}

// Sandbox is the cluster's record of one sandbox; its name is the sandbox's id.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbx,categories=bothy
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`,priority=1
// +kubebuilder:printcolumn:name="Runtime",type=string,JSONPath=`.spec.runtime`,priority=1
// +kubebuilder:printcolumn:name="Memory",type=integer,JSONPath=`.spec.resources.memoryMB`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec SandboxSpec `json:"spec,omitempty"`
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
//
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

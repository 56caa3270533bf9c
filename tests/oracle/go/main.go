// The CNI annotations as Multus, Calico and Kube-OVN read them, with Go's own encoding/json
// and net: the reference tests/real_readers.rs holds ip-webhook's readings to.
//
// One case per line on stdin, one answer per line on stdout, in order:
//
//	{"kind":"networks","value":"...","namespace":"default"}
//	{"kind":"calico" | "ovn_ip_address" | "ovn_ip_pool","value":"..."}
//
// An answer is {"ok":<reading>} or {"refused":"<why>"}. Standard library only; nothing here is
// the readers' own code: each function says which of theirs it follows.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
)

type request struct {
	Kind      string `json:"kind"`
	Value     string `json:"value"`
	Namespace string `json:"namespace"`
}

// The field names and Go types of Multus's NetworkSelectionElement and the types it uses
// (k8snetworkplumbingwg/multus-cni pkg/types/types.go): json.Unmarshal matches keys and
// checks value types against these.
type portMapEntry struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

type bandwidthEntry struct {
	IngressRate  int `json:"ingressRate"`
	IngressBurst int `json:"ingressBurst"`
	EgressRate   int `json:"egressRate"`
	EgressBurst  int `json:"egressBurst"`
}

type networkSelectionElement struct {
	Name                       string                  `json:"name"`
	Namespace                  string                  `json:"namespace,omitempty"`
	IPRequest                  []string                `json:"ips,omitempty"`
	MacRequest                 string                  `json:"mac,omitempty"`
	InfinibandGUIDRequest      string                  `json:"infiniband-guid,omitempty"`
	InterfaceRequest           string                  `json:"interface,omitempty"`
	DeprecatedInterfaceRequest string                  `json:"interfaceRequest,omitempty"`
	PortMappingsRequest        []*portMapEntry         `json:"portMappings,omitempty"`
	BandwidthRequest           *bandwidthEntry         `json:"bandwidth,omitempty"`
	DeviceID                   string                  `json:"deviceID,omitempty"`
	CNIArgs                    *map[string]interface{} `json:"cni-args"`
	GatewayRequest             *[]net.IP               `json:"default-route,omitempty"`
}

type ipReading struct {
	IP     string `json:"ip"`
	Prefix *int   `json:"prefix,omitempty"`
}

type attachment struct {
	Name      string      `json:"name"`
	Namespace string      `json:"namespace"`
	Interface string      `json:"interface"`
	IPs       []ipReading `json:"ips"`
}

var dnsLabel = regexp.MustCompile("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

// One item of the list form, as multus-cni pkg/k8sclient/k8sclient.go
// parsePodNetworkObjectName splits and checks it.
func listItem(item string) (networkSelectionElement, error) {
	var element networkSelectionElement
	slash := strings.Split(item, "/")
	name := ""
	switch len(slash) {
	case 1:
		name = slash[0]
	case 2:
		element.Namespace = strings.TrimSpace(slash[0])
		name = slash[1]
	default:
		return element, fmt.Errorf("more than one '/'")
	}
	at := strings.Split(name, "@")
	element.Name = strings.TrimSpace(at[0])
	switch len(at) {
	case 1:
	case 2:
		element.InterfaceRequest = strings.TrimSpace(at[1])
	default:
		return element, fmt.Errorf("more than one '@'")
	}
	for _, part := range []string{element.Namespace, element.Name} {
		if part != "" && !dnsLabel.MatchString(part) {
			return element, fmt.Errorf("%q is not a DNS-1123 label", part)
		}
	}
	iface := element.InterfaceRequest
	if iface != "" && (len(iface) > 15 || strings.ContainsAny(iface, " \t\n\v\f\r/")) {
		return element, fmt.Errorf("bad interface %q", iface)
	}
	return element, nil
}

// The IP of `ips`, as the static IPAM plugin configures it: To4 when it has one, and the
// mask's length as that address's (containernetworking/plugins ipam/static, which reads
// each entry with net.ParseCIDR and keeps the IPv4 form).
func readIP(text string) (ipReading, error) {
	if strings.Contains(text, "/") {
		ip, ipnet, err := net.ParseCIDR(text)
		if err != nil {
			return ipReading{}, err
		}
		ones, bits := ipnet.Mask.Size()
		if v4 := ip.To4(); v4 != nil {
			ip = v4
			if bits == 128 {
				ones -= 96
				if ones < 0 {
					ones = 0
				}
			}
		}
		return ipReading{IP: ip.String(), Prefix: &ones}, nil
	}
	ip := net.ParseIP(text)
	if ip == nil {
		return ipReading{}, fmt.Errorf("not an IP: %q", text)
	}
	return ipReading{IP: ip.String()}, nil
}

// multus-cni pkg/k8sclient/k8sclient.go parsePodNetworkAnnotation: the forms, then each
// element completed and checked.
func networks(value, namespace string) (reading []attachment, err error) {
	defer func() {
		// a null element: Multus dereferences it and fails the pod
		if recovered := recover(); recovered != nil {
			reading, err = nil, fmt.Errorf("panic: %v", recovered)
		}
	}()
	var elements []*networkSelectionElement
	if value == "" {
		return []attachment{}, nil
	}
	if strings.ContainsAny(value, "[{\"") {
		if err := json.Unmarshal([]byte(value), &elements); err != nil {
			return nil, err
		}
	} else {
		for _, item := range strings.Split(value, ",") {
			element, err := listItem(strings.TrimSpace(item))
			if err != nil {
				return nil, err
			}
			elements = append(elements, &element)
		}
	}
	reading = []attachment{}
	for _, n := range elements {
		if n.Namespace == "" {
			n.Namespace = namespace
		}
		for _, mac := range []string{n.MacRequest, n.InfinibandGUIDRequest} {
			if mac != "" {
				if _, err := net.ParseMAC(mac); err != nil {
					return nil, err
				}
			}
		}
		ips := []ipReading{}
		for _, text := range n.IPRequest {
			ip, err := readIP(text)
			if err != nil {
				return nil, err
			}
			ips = append(ips, ip)
		}
		if n.DeprecatedInterfaceRequest != "" && n.InterfaceRequest == "" {
			n.InterfaceRequest = n.DeprecatedInterfaceRequest
		}
		reading = append(reading, attachment{n.Name, n.Namespace, n.InterfaceRequest, ips})
	}
	return reading, nil
}

func canonical(ip net.IP) string {
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.String()
}

// projectcalico/calico cni-plugin/pkg/k8s/k8s.go validateAndExtractIPs and parseIPAddrs.
func calico(value string) ([]string, error) {
	var items []string
	if err := json.Unmarshal([]byte(value), &items); err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("specified but empty")
	}
	return onePerFamily(items)
}

func onePerFamily(items []string) ([]string, error) {
	ips := []string{}
	var v4, v6 bool
	for _, item := range items {
		ip := net.ParseIP(item)
		if ip == nil {
			return nil, fmt.Errorf("invalid IP format: %q", item)
		}
		family := &v6
		if ip.To4() != nil {
			family = &v4
		}
		if *family {
			return nil, fmt.Errorf("two of one family")
		}
		*family = true
		ips = append(ips, canonical(ip))
	}
	return ips, nil
}

// kubeovn/kube-ovn pkg/controller/pod.go acquireStaticAddress: split on ',', each item to
// net.ParseIP as written.
func ovnIPAddress(value string) ([]string, error) {
	ips := []string{}
	for _, item := range strings.Split(value, ",") {
		ip := net.ParseIP(item)
		if ip == nil {
			return nil, fmt.Errorf("failed to parse IP %q", item)
		}
		ips = append(ips, canonical(ip))
	}
	return ips, nil
}

// kube-ovn's ip_pool: whether it names an IPPool object or IPs as the controller decides
// (pkg/controller/pod.go acquireAddress: split on ';' if any, else ','; each entry trimmed; one
// entry with no ',' that net.ParseIP refuses is a pool name), and each IP checked as the
// webhook checks it (pkg/util/validator.go ValidatePodNetwork: every item of every entry,
// trimmed, to net.ParseIP). The reading is {"pool": true} or the IPs, in order.
func ovnIPPool(value string) (interface{}, error) {
	var entries []string
	if strings.ContainsRune(value, ';') {
		entries = strings.Split(value, ";")
	} else {
		entries = strings.Split(value, ",")
	}
	for i := range entries {
		entries[i] = strings.TrimSpace(entries[i])
	}
	if len(entries) == 1 && !strings.ContainsRune(entries[0], ',') && net.ParseIP(entries[0]) == nil {
		return map[string]bool{"pool": true}, nil
	}
	ips := []string{}
	for _, entry := range strings.Split(value, ";") {
		for _, item := range strings.Split(entry, ",") {
			ip := net.ParseIP(strings.TrimSpace(item))
			if ip == nil {
				return nil, fmt.Errorf("%q is not a valid address", item)
			}
			ips = append(ips, canonical(ip))
		}
	}
	return ips, nil
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	encoder := json.NewEncoder(out)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "a case that is not JSON: %v\n", err)
			os.Exit(2)
		}
		var reading interface{}
		var err error
		switch req.Kind {
		case "networks":
			reading, err = networks(req.Value, req.Namespace)
		case "calico":
			reading, err = calico(req.Value)
		case "ovn_ip_address":
			reading, err = ovnIPAddress(req.Value)
		case "ovn_ip_pool":
			reading, err = ovnIPPool(req.Value)
		default:
			fmt.Fprintf(os.Stderr, "unknown kind %q\n", req.Kind)
			os.Exit(2)
		}
		answer := map[string]interface{}{"ok": reading}
		if err != nil {
			answer = map[string]interface{}{"refused": err.Error()}
		}
		if err := encoder.Encode(answer); err != nil {
			fmt.Fprintf(os.Stderr, "writing: %v\n", err)
			os.Exit(2)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "reading stdin: %v\n", err)
		os.Exit(2)
	}
}

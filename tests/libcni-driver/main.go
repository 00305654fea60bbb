// libcni-driver runs a conflist through the real libcni, the library containerd's and
// CRI-O's CNI layers call, so the tests exercise sandbox-guard exactly as a node would:
// libcni picks the plugins, injects prevResult, keeps its result cache and runs DEL in
// reverse order, halting at the first plugin that fails.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	conflist := flag.String("conflist", "", "conflist file")
	binDirs := flag.String("bin-dir", "", "plugin directories, colon separated")
	cacheDir := flag.String("cache-dir", "", "libcni result cache directory")
	containerID := flag.String("container-id", "", "CNI_CONTAINERID")
	netns := flag.String("netns", "", "CNI_NETNS (may be empty on DEL, as containerd's RemovePodSandbox sends it)")
	ifName := flag.String("ifname", "eth0", "CNI_IFNAME")
	cniArgs := flag.String("args", "", "CNI_ARGS as K=V;K=V")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s -conflist FILE -bin-dir DIR[:DIR] -cache-dir DIR -container-id ID [-netns PATH] [-ifname IF] [-args 'K=V;...'] add|check|del\n", filepath.Base(os.Args[0]))
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *conflist == "" || *binDirs == "" || *cacheDir == "" || *containerID == "" {
		flag.Usage()
		os.Exit(2)
	}

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(*binDirs), *cacheDir, nil)
	rt, err := runtimeConf(*containerID, *netns, *ifName, *cniArgs)
	if err != nil {
		fail(err)
	}

	ctx := context.Background()
	switch flag.Arg(0) {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		out, err := json.Marshal(result)
		if err != nil {
			fail(err)
		}
		fmt.Println(string(out))
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

// runtimeConf mirrors what containerd's CRI plugin hands libcni: the pod labels as CNI
// args plus IgnoreUnknown=1, so plugins that do not know the K8S_* keys still accept them.
func runtimeConf(containerID, netns, ifName, cniArgs string) (*libcni.RuntimeConf, error) {
	args := [][2]string{{"IgnoreUnknown", "1"}}
	for _, pair := range strings.Split(cniArgs, ";") {
		if pair == "" {
			continue
		}
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 {
			return nil, fmt.Errorf("CNI arg %q is not K=V", pair)
		}
		if kv[0] == "IgnoreUnknown" {
			continue
		}
		args = append(args, [2]string{kv[0], kv[1]})
	}
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: netns, IfName: ifName, Args: args}, nil
}

// fail reports the plugin's own CNI error code separately from libcni's wrapping text,
// because callers (tests, the demo) decide on the code, not on the prose.
func fail(err error) {
	var cniErr *types.Error
	if !errors.As(err, &cniErr) {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "CNI error code %d: %s\n", cniErr.Code, cniErr.Msg)
	if cniErr.Details != "" {
		fmt.Fprintf(os.Stderr, "details: %s\n", cniErr.Details)
	}
	// libcni prefixes which plugin failed; the plugin's message is already printed above.
	if where := strings.TrimSuffix(strings.TrimSuffix(err.Error(), cniErr.Error()), ": "); where != "" {
		fmt.Fprintf(os.Stderr, "libcni: %s\n", where)
	}
	os.Exit(1)
}

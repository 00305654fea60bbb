// libcni-convert prints a CNI result converted to another version by libcni's own
// converters (pkg/types/create and GetAsVersion), the code every runtime's libcni runs
// between a plugin's result and the conflist's version. The tests compare sandbox-guard's
// conversions with its output.
// Usage: libcni-convert TO_VERSION < result.json
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/types/create"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: libcni-convert TO_VERSION < result.json")
		os.Exit(2)
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	result, err := create.CreateFromBytes(input)
	if err != nil {
		fail(err)
	}
	converted, err := result.GetAsVersion(os.Args[1])
	if err != nil {
		fail(err)
	}
	out, err := json.Marshal(converted)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

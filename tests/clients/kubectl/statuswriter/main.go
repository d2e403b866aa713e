// Command statuswriter writes a Widget's status the way a client-go
// controller does: retry.RetryOnConflict around get, set the members given,
// UpdateStatus. It prints the attempts made and how the last one ended, so
// that a test sees what client-go's conflict retry does with each engine's
// denial (a 409 is retried with a fresh copy, anything else is not).
//
//	statuswriter -namespace NS -name NAME -status '{"replicas": 3}'
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

func main() {
	namespace := flag.String("namespace", "", "the Widget's namespace")
	name := flag.String("name", "", "the Widget's name")
	status := flag.String("status", "{}", "status members to set, as a JSON object")
	flag.Parse()
	var members map[string]interface{}
	if err := json.Unmarshal([]byte(*status), &members); err != nil {
		fmt.Fprintln(os.Stderr, "-status:", err)
		os.Exit(2)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	config, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		os.Exit(2)
	}
	client := dynamic.NewForConfigOrDie(config).
		Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}).
		Namespace(*namespace)
	attempts := 0
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		attempts++
		object, err := client.Get(context.Background(), *name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current, _ := object.Object["status"].(map[string]interface{})
		if current == nil {
			current = map[string]interface{}{}
		}
		for key, value := range members {
			current[key] = value
		}
		object.Object["status"] = current
		_, err = client.UpdateStatus(context.Background(), object, metav1.UpdateOptions{})
		return err
	})
	reason := "Success"
	if err != nil {
		reason = string(apierrors.ReasonForError(err))
	}
	fmt.Printf("attempts=%d reason=%s\n", attempts, reason)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

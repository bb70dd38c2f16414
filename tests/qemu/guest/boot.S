/* Multiboot v1 entry and interrupt stubs for the test guest (see kmain.c).
 * QEMU's -kernel loads this ELF at 1 MiB in 32-bit protected mode, paging off,
 * interrupts off, EAX = 0x2BADB002 and EBX = the Multiboot information. */
#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x3 /* page-align modules, give the memory fields */

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

    .text
    .globl _start
_start:
    cli
    mov $stack_top, %esp
    push %ebx
    push %eax
    call kmain
1:  cli
    hlt
    jmp 1b

/* Called by kmain after lgdt: reload CS through a far return, then the data segments. */
    .globl reload_segments
reload_segments:
    pushl $0x08
    pushl $2f
    lret
2:  mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %fs
    mov %ax, %gs
    mov %ax, %ss
    ret

/* Exceptions 0..31 push their vector and go to guest_fault(vector), which never returns. */
    .macro fault_stub n
fault_\n:
    cli
    pushl $\n
    call guest_fault
    .endm
    .altmacro
    .set i, 0
    .rept 32
    fault_stub %i
    .set i, i + 1
    .endr

    .section .rodata
    .align 4
    .globl fault_stubs
fault_stubs:
    .macro stub_addr n
    .long fault_\n
    .endm
    .set i, 0
    .rept 32
    stub_addr %i
    .set i, i + 1
    .endr

    .text
/* IRQ0 (PIT): count a tick, EOI the master PIC. */
    .globl irq0_stub
irq0_stub:
    push %eax
    incl ticks
    mov $0x20, %al
    outb %al, $0x20
    pop %eax
    iret

/* Any other PIC line (masked, but IRQ7/15 can be spurious): EOI both PICs. */
    .globl irq_other_stub
irq_other_stub:
    push %eax
    mov $0x20, %al
    outb %al, $0xA0
    outb %al, $0x20
    pop %eax
    iret

    .bss
    .align 16
    .space 16384
stack_top:

    .section .note.GNU-stack, "", @progbits
